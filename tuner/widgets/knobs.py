"""The knobs panel: the active speculative setting, the keys that change it, and why a knob is absent.

A control is drawn only when the backend can do it; otherwise the panel says why and what would
(e.g. a relaunch). The key hints are clickable: a click posts `KnobsPanel.Pressed` with the action
of the same key, and the app runs it. This widget never talks to the backend nor calls the app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from textual.content import Content
from textual.markup import escape
from textual.message import Message
from textual.widgets import Static

from tuner.core import setting as vocab


@dataclass(frozen=True)
class KnobView:
    values: Mapping[str, Any] = field(default_factory=dict)
    """knob server-arg name -> its active value (a knob the server has not reported is absent)."""
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
    relaunch: frozenset[str] = frozenset()
    """Knobs whose keys offer a relaunch (managed mode: the server cannot change them live)."""
    notes: Mapping[str, str] = field(default_factory=dict)
    """knob server-arg name -> what limits its live values, e.g. "tiers 1 3 5 7 · 5 pinned at bs 1-7 only"."""


def knob_action(k: vocab.Knob, delta: int) -> str:
    """The app action of one knob move: what its key is bound to and what its key hint clicks."""
    return f"knob({k.name!r}, {delta})"


def _button(action: str, key: str) -> str:
    # Quoted: the markup parser reads `knob(...)` unquoted as a broken value.
    return f"[@click=\"{action}\"][reverse] {escape(key)} [/reverse][/]"


def _controls(k: vocab.Knob) -> str:
    """The clickable key hints of one knob: "less more" for a stepped knob, "next" for a cycled one."""
    if k.cycled:
        return f"{_button(knob_action(k, 1), k.shown[0])} [dim]next[/]"
    return f"{_button(knob_action(k, -1), k.shown[1])} {_button(knob_action(k, 1), k.shown[0])}"


class KnobsPanel(Static):
    DEFAULT_CSS = "KnobsPanel { height: auto; }"

    @dataclass
    class Pressed(Message):
        """A key hint was clicked: `action` is what its key is bound to."""

        action: str

    # The hints' clicks land here (the widget is their namespace) and go up as messages.
    def action_knob(self, name: str, delta: int = 1) -> None:
        k = vocab.knob(name)
        if k is not None:
            self.post_message(self.Pressed(knob_action(k, delta)))

    def action_toggle_load(self) -> None:
        self.post_message(self.Pressed("toggle_load"))

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
        for k in vocab.knobs():
            value = view.values.get(k.arg)
            if value is None and k.key not in vocab.CORE and (view.read_only or k.arg in view.unavailable):
                continue      # a knob this server does not have (SGLang's accept threshold on our engine)
            if k.cycled:     # a word: shown bold, "?" until reported
                shown = f"[b]{escape(str(value or '?')):>4}[/]"
            else:
                shown = "[dim]   ?[/]" if value is None else f"[b]{escape(str(value)):>4}[/]"
            line = f"{k.label:<13}{shown}"
            if view.read_only:
                pass
            elif k.arg in view.unavailable:
                line += f"  [dim i]{escape(view.unavailable[k.arg])}[/]"
            else:
                line += f"  {_controls(k)}"
                if k.arg in view.relaunch:
                    line += "  [dim i]by relaunch[/]"
                if k.arg in view.notes:
                    line += f"  [dim i]{escape(view.notes[k.arg])}[/]"
            lines.append(line)
        if view.load:
            load = f"{'load':<13}{escape(view.load)}"
            if not view.read_only:
                load += f"  {_button('toggle_load', 'l')}"
            lines.append(load)
        if view.pending:
            lines.append(f"[$warning]⧗ sent {escape(view.pending)}, waiting for the server[/]")
        if view.refused:
            lines.append(f"[$error]✗ refused: {escape(view.refused)}[/]")
        return Content.from_markup("\n".join(lines))
