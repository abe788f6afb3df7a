"""The relaunch confirmation: managed mode asks before it stops the server to apply a setting.

Shows the question and the exact command that would run (secrets already redacted by the caller);
y or enter confirms, n or escape declines. It only asks: the app runs the relaunch.
"""

from __future__ import annotations

from typing import Iterable

from rich.text import Text
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Static

from tuner.screens.modal import ModalBox


class RelaunchConfirm(ModalBox[bool]):
    """Dismissed with True (relaunch) or False (leave the server as it is)."""

    BINDINGS = [
        Binding("y,enter", "answer(True)", "relaunch"),
        Binding("n,escape", "answer(False)", "cancel"),
    ]
    DEFAULT_CSS = """
    RelaunchConfirm > .box { width: 90%; height: auto; max-height: 80%; border: round $warning; }
    RelaunchConfirm #relaunch-command { color: $text-muted; margin-top: 1; }
    RelaunchConfirm #relaunch-keys { margin-top: 1; }
    """

    def __init__(self, question: str, command: str) -> None:
        super().__init__()
        # The question's own first line; the command is shown apart, in full.
        self.question = question.splitlines()[0] if question else "Relaunch the server?"
        self.command = command

    SCROLLS = False
    BOX_TITLE = "relaunch the server?"

    def body(self) -> Iterable[Widget]:
        yield Static(Text(self.question, style="bold"), id="relaunch-question")
        yield Static(Text(self.command), id="relaunch-command")
        yield Static(Text.assemble(("y", "bold"), " / enter: relaunch    ", ("n", "bold"),
                                   " / esc: leave it as it is"), id="relaunch-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
