"""Reports from recordings: read once (data), figure out (summary), then render (html, markdown,
JSON via Summary.to_json) or export (Perfetto trace, CSV). Reads only the recording file; never a
server, never textual.
"""

from tuner.report.data import RecordingData, load
from tuner.report.summary import Summary, summarize

__all__ = ["RecordingData", "Summary", "load", "summarize"]
