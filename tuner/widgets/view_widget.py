"""The panels' shared redraw rule: a panel holds one frozen view and redraws only when it changed.

`ViewWidget.show(view)` stores the new view and refreshes; it asks Textual for a new layout (the
costly part) only when `shape(view)` changed, i.e. when the number of lines can change. Subclasses
name their empty view (`VIEW`), say what their shape is, and draw `self.view` in `render()`. Must not
read the store or the session: views are built elsewhere (tuner.widgets.views) and handed in.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Hashable, TypeVar

from textual.widgets import Static

V = TypeVar("V")


class ViewWidget(Static, Generic[V]):
    DEFAULT_CSS = "ViewWidget { height: auto; }"
    VIEW: ClassVar[Any]
    """The view class; its no-argument instance is what the panel shows before the first `show`."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._view: V = self.VIEW()

    @property
    def view(self) -> V:
        return self._view

    def shape(self, view: V) -> Hashable:
        """What decides the panel's line count: a new layout only when it changes."""
        return None

    def show(self, view: V) -> None:
        if view != self._view:
            self.refresh(layout=self.shape(view) != self.shape(self._view))
            self._view = view
