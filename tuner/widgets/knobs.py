"""The knobs panel: the active speculative setting, the keys that change it, and why a knob is absent.

A control is drawn only when the backend can do it; otherwise the panel says why and what would
(e.g. a relaunch). The key hints are clickable and run the same app actions as the keys. This widget
never talks to the backend: clicks and keys become app actions, the app sends the change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.content import Content
from textual.markup import escape
from textual.widgets import Static

from probes.names import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK


@dataclass(frozen=True)
class KnobView:
    steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    placement: str | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    """knob key -> why it cannot be changed here (and what would), for knobs the backend lacks."""
    pending: str = ""
    """A change sent and not yet confirmed, e.g. "steps 3 → 4"."""
    refused: str = ""
    """The server's reason for the last refusal, shown until the next change."""
    load: str = ""
    """The load driver's state, e.g. "4 concurrent · 31.2 tok/s", "off", or why it cannot run."""
    read_only: bool = False
    """Replay: show the setting, no controls."""


# (view attribute, label, action for "less", key, action for "more", key, capability key)
ROWS = (
    ("steps", "steps", "app.steps(-1)", "-", "app.steps(1)", "+", STEPS),
    ("topk", "topk", "app.topk(-1)", "T", "app.topk(1)", "t", TOPK),
    ("num_draft_tokens", "draft tokens", "app.draft_tokens(-1)", "D", "app.draft_tokens(1)", "d",
     DRAFT_TOKENS),
)


def _button(action: str, key: str) -> str:
    # Quoted: the markup parser reads `steps(-1)` unquoted as a broken value.
    return f"[@click=\"{action}\"][reverse] {escape(key)} [/reverse][/]"


class KnobsPanel(Static):
    DEFAULT_CSS = "KnobsPanel { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._view = KnobView()
        self._lines = -1

    def show(self, view: KnobView) -> None:
        if view != self._view:
            content = self.markup(view)
            lines = len(content.plain.splitlines())
            self.update(content, layout=lines != self._lines)   # layout only when it grows or shrinks
            self._lines = lines
            self._view = view

    @staticmethod
    def markup(view: KnobView) -> Content:
        lines: list[str] = []
        for attr, label, less, less_key, more, more_key, cap in ROWS:
            value = getattr(view, attr)
            shown = "[dim]   ?[/]" if value is None else f"[b]{value:>4}[/]"
            line = f"{label:<13}{shown}"
            if view.read_only:
                pass
            elif cap in view.unavailable:
                line += f"  [dim i]{escape(view.unavailable[cap])}[/]"
            else:
                line += f"  {_button(less, less_key)} {_button(more, more_key)}"
            lines.append(line)
        placement = view.placement or "?"
        line = f"{'placement':<13}[b]{escape(placement):>4}[/]"
        cap = PLACEMENT
        if not view.read_only:
            if cap in view.unavailable:
                line += f"  [dim i]{escape(view.unavailable[cap])}[/]"
            else:
                line += f"  {_button('app.placement', 'p')} [dim]next[/]"
        lines.append(line)
        if view.load:
            load = f"{'load':<13}{escape(view.load)}"
            if not view.read_only:
                load += f"  {_button('app.toggle_load', 'l')}"
            lines.append(load)
        if view.pending:
            lines.append(f"[$warning]⧗ sent {escape(view.pending)}, waiting for the server[/]")
        if view.refused:
            lines.append(f"[$error]✗ refused: {escape(view.refused)}[/]")
        return Content.from_markup("\n".join(lines))
