"""Textual messages of the TUI: worker results coming back to the app.

Widgets only post these; the app decides what to do with them (Textual's "messages up"). Nothing
here measures or holds state: a sample never travels as a message, widgets pull the store instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass
class ControlFinished(Message):
    """A control call to the backend came back: applied, or refused with the server's reason."""

    key: str
    value: Any
    ok: bool
    reason: str = ""


@dataclass
class CaptureProgress(Message):
    """A trace capture moved on; `fraction` is None while the length is unknown."""

    text: str
    fraction: float | None = None

    def can_replace(self, message: Message) -> bool:
        # Only the latest progress matters; coalesce, as Toolong does for its size messages.
        return isinstance(message, CaptureProgress)


@dataclass
class CaptureFinished(Message):
    """A trace capture ended: the analysis result dict, or an error sentence."""

    analysis: dict[str, Any] | None
    error: str = ""
    folder: str = ""
    """Where the rank files are kept (for Perfetto); "" when they are not."""

    @classmethod
    def of(cls, captured: Any, error: str) -> "CaptureFinished":
        """From the driver's capture result (None when it failed: the driver noted why, so the log
        and a recording say so too)."""
        if captured is None:
            return cls(None, error)
        failed = f"captured, but the analysis failed: {captured.analysis_error}"
        return cls(captured.analysis, "" if captured.analysis else failed, captured.folder)


@dataclass
class PySpyFinished(Message):
    """A py-spy run over the server's processes ended: its top functions, or an error sentence."""

    result: Any
    error: str = ""


@dataclass
class RelaunchProgress(Message):
    """Managed mode's relaunch moved on (stopping, starting, the server log's newest line)."""

    text: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RelaunchProgress)


@dataclass
class RelaunchFinished(Message):
    """A managed relaunch ended: the server runs `changes`, or `error` says why not."""

    changes: dict[str, Any]
    ok: bool
    error: str = ""
