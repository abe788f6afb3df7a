"""Recordings: one SQLite file per session (schema, writer thread, reader, replay). No textual, no torch."""

from tuner.recording.reader import RecordingReader, open_recording
from tuner.recording.recorder import Recorder, header_for
from tuner.recording.schema import SCHEMA_VERSION, RecordingError

__all__ = ["Recorder", "header_for", "RecordingReader", "RecordingError", "open_recording", "SCHEMA_VERSION", "ReplayBackend"]


def __getattr__(name: str):   # the replay backend pulls in backends.base; load it on first use
    if name == "ReplayBackend":
        from tuner.recording.replay import ReplayBackend
        return ReplayBackend
    raise AttributeError(name)
