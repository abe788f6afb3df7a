"""The event log panel: setting changes, refusals, captures, disconnects, one line each.

Lines are appended as the app hands over events it has not shown yet. The newest line stays in view
until the operator scrolls up to read older ones, and again once they scroll back to the bottom: an
explicit follow flag that only the operator's own scrolling changes. (Inferring "scrolled up" from
the geometry at each append broke when a neighbouring panel grew: the log shrank, its last line fell
below the view, and the log stopped following for good.) Times are relative to the session start so
a replayed log reads the same as the live one.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from tuner.core.text import terminal_safe
from tuner.widgets.fmt import rel_time

LEVEL_STYLE = {"info": "", "good": "#8bc34a", "warn": "#e0b040", "error": "#d96e6e", "dim": "dim"}
MAX_LINES = 500


@dataclass(frozen=True)
class LogLine:
    t: float
    """Seconds since the session started."""
    text: str
    level: str = "info"


def render_line(line: LogLine) -> Text:
    text = Text(rel_time(line.t) + " ", style="dim")
    text.append(terminal_safe(line.text), style=LEVEL_STYLE.get(line.level, ""))   # server strings are data
    return text


class EventLog(VerticalScroll):
    DEFAULT_CSS = """
    EventLog { height: 1fr; background: transparent; scrollbar-size-vertical: 1; }
    EventLog > Static { width: 1fr; }
    """

    # Not focusable: the arrow keys belong to the app (replay seeks); the mouse wheel still scrolls.
    can_focus = False

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: list[LogLine] = []
        self.follow = True
        """Keep the newest line in view; only the operator's scrolling clears or sets it."""
        self._one_row = False

    @property
    def one_row(self) -> bool:
        """Each event on one row, cut with an ellipsis: a short terminal shows its newest 3 in 3 rows."""
        return self._one_row

    @one_row.setter
    def one_row(self, value: bool) -> None:
        if value != self._one_row:
            self._one_row = value
            self._show()
            self._keep_newest()

    def compose(self) -> ComposeResult:
        yield Static()

    def add(self, lines: list[LogLine]) -> None:
        if not lines:
            return
        self.lines = (self.lines + lines)[-MAX_LINES:]
        self._show()
        self._keep_newest()

    def _keep_newest(self) -> None:
        if self.follow:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

    def on_resize(self, event: events.Resize) -> None:
        # A neighbour grew or shrank: the newest line must stay in view whatever the new height.
        self._keep_newest()

    # The operator's scrolling (the mouse wheel and the scrollbar; the log takes no focus, so no
    # keys): up leaves the newest line, back down to the end follows again.
    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        if self.max_scroll_y > 0:
            self.follow = False

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self.call_after_refresh(self._follow_if_at_end)

    def on_scroll_to(self, message) -> None:
        self.call_after_refresh(self._follow_if_at_end)

    on_scroll_up = on_scroll_down = on_scroll_to

    def _follow_if_at_end(self) -> None:
        self.follow = self.scroll_target_y >= self.max_scroll_y - 1

    def clear(self) -> None:
        self.lines = []
        self.follow = True
        self._show()

    def plain(self) -> str:
        """The log as a person reads it (tests and the tmux check compare this)."""
        return "\n".join(render_line(line).plain for line in self.lines)

    def _show(self) -> None:
        if self._one_row:
            rows = []
            for line in self.lines:
                row = render_line(line)
                row.no_wrap, row.overflow = True, "ellipsis"
                rows.append(row)
            self.query_one(Static).update(Group(*rows))
        else:
            self.query_one(Static).update(Text("\n").join(render_line(line) for line in self.lines))
