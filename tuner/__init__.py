"""specdecode-tune: the operator's side — CLI, headless session, recording, report, tuner and TUI.

Must not import torch or refengine: every server, ours included, is reached over HTTP.
"""

__version__ = "0.1.0"
