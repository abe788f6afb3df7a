"""The event log panel: setting changes, refusals, captures, disconnects, one line each.

Lines are appended as the app hands over events it has not shown yet; the widget keeps no other
state. Times are relative to the session start so a replayed log reads the same as the live one.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import RichLog

from tuner.widgets.fmt import rel_time

LEVEL_STYLE = {"info": "", "good": "#8bc34a", "warn": "#e0b040", "error": "#d96e6e", "dim": "dim"}


@dataclass(frozen=True)
class LogLine:
    t: float
    """Seconds since the session started."""
    text: str
    level: str = "info"


class EventLog(RichLog):
    DEFAULT_CSS = "EventLog { height: 1fr; background: transparent; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=500, wrap=True, min_width=20, markup=False, highlight=False, auto_scroll=True)

    def add(self, lines: list[LogLine]) -> None:
        for line in lines:
            text = Text(rel_time(line.t) + " ", style="dim")
            text.append(line.text, style=LEVEL_STYLE.get(line.level, ""))
            self.write(text)
