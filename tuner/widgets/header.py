"""The top bar: which server (kind, version, model, TP), the active setting, and the connection.

No clock: a header that shows the time would make every screenshot different. In replay the bar
shows the position in the recording instead of the connection.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from textual.content import Content
from textual.markup import escape
from textual.widgets import Static

from tuner.core.text import terminal_safe
from tuner.widgets.fmt import rel_time


@dataclass(frozen=True)
class HeaderView:
    kind: str = ""
    """Server kind, e.g. "refengine" or "sglang"."""
    version: str = ""
    model: str = ""
    tp: int | None = None
    host: str = ""
    setting: str = ""
    """The active speculative setting, e.g. "steps 3 · topk 1 · draft 4 · sharded"."""
    connection: str = "connecting"
    """"connected", "connecting", "degraded", "disconnected", or "replay"."""
    detail: str = ""
    """Extra words after the state: the error of a disconnect, the replay position."""
    notes: tuple[str, ...] = ()
    """Flags a reader must not miss: "emulated comm 200 µs", "GPUs on another host"."""


_STATE = {
    "connected": ("●", "$success"),
    "connecting": ("◌", "$warning"),
    "degraded": ("◐", "$warning"),
    "disconnected": ("○", "$error"),
    "replay": ("▶", "$accent"),
    "paused": ("‖", "$accent"),
}


class ServerHeader(Static):
    DEFAULT_CSS = "ServerHeader { height: 2; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._view: HeaderView | None = None

    def show(self, view: HeaderView) -> None:
        if view != self._view:
            self._view = view
            self.update(self.markup(view), layout=False)   # always two lines

    @staticmethod
    def markup(view: HeaderView) -> Content:
        # Server strings are data: escape Textual markup and drop terminal control sequences.
        view = replace(view, **{k: terminal_safe(getattr(view, k)) for k in
                                ("kind", "version", "model", "host", "setting", "connection", "detail")},
                       notes=tuple(terminal_safe(n) for n in view.notes))
        who = escape(" ".join(x for x in (view.kind or "server", view.version) if x))
        parts = [f"[b $accent]specdecode-tune[/] [dim]▸[/] [b]{who}[/]"]
        if view.model:
            parts.append(escape(view.model))
        if view.tp is not None:
            parts.append(f"TP {view.tp}")
        if view.host:
            parts.append(f"[dim]{escape(view.host)}[/]")
        glyph, color = _STATE.get(view.connection, ("?", "$warning"))
        state = f"[{color}]{glyph} {escape(view.connection)}[/]"
        if view.detail:
            state += f" [dim]{escape(view.detail)}[/]"
        line1 = "[dim] · [/]".join(parts) + "   " + state
        line2 = f"[dim]active[/] [b]{escape(view.setting or '?')}[/]"
        for note in view.notes:
            line2 += f"  [$warning]▲ {escape(note)}[/]"
        return Content.from_markup(line1 + "\n" + line2)


def replay_detail(position: float, length: float, speed: float) -> str:
    """`+0:42.0 / 2:00.0 · 2×` for the replay state (paused or playing is the state's own word)."""
    return f"{rel_time(position)} / {rel_time(length)[1:]} · {speed:g}×"
