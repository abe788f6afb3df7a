"""The modal screens' shared frame: a box centred over the main screen, with a title and a subtitle.

`ModalBox` is the frame (its CSS once); `ModalPanel` adds the close keys (esc, q) of every panel
that only shows something. Subclasses yield their content from `body()` and size the box with
`<Subclass> > .box { ... }`. Must not hold state or talk to the session: a panel shows what it was
given.
"""

from __future__ import annotations

from typing import ClassVar, Iterable, TypeVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widget import Widget

T = TypeVar("T")


class ModalBox(ModalScreen[T]):
    """A bordered box in the middle of the terminal; `body()` fills it."""

    DEFAULT_CSS = """
    ModalBox { align: center middle; }
    ModalBox > .box { width: 95%; height: 90%; border: round $accent; background: $surface; padding: 0 1; }
    """
    SCROLLS: ClassVar[bool] = True
    """A scrolling box (long content) or one as tall as its content."""
    BOX_TITLE: ClassVar[str] = ""
    BOX_SUBTITLE: ClassVar[str] = ""

    def body(self) -> Iterable[Widget]:
        return ()

    def compose(self) -> ComposeResult:
        with (VerticalScroll if self.SCROLLS else Vertical)(classes="box"):
            yield from self.body()

    def on_mount(self) -> None:
        box = self.query_one(".box")
        box.border_title = self.box_title()
        if self.BOX_SUBTITLE:
            box.border_subtitle = self.BOX_SUBTITLE

    def box_title(self) -> str:
        return self.BOX_TITLE


class ModalPanel(ModalBox[T]):
    """A box that only shows something: esc or q closes it."""

    BINDINGS = [Binding("escape,q", "dismiss", "close")]
    BOX_SUBTITLE = "esc to close"
