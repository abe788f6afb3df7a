"""The main screen's footer: every key on one line down to 100 columns, and the keys that matter
most (the knobs that move the demo, the tune screen, help, quit) on one line at 80.

Textual's Footer, compact and without the palette's hint when its keys do not fit otherwise;
below NARROW_BELOW columns the keys of OPTIONAL leave the footer too (they still work; help lists
them). It draws the bindings the app
declares and adds none of its own.
"""

from __future__ import annotations

from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tuner.core import setting as vocab
from tuner.widgets.knobs import knob_action

PALETTE_HINT = 14
"""Columns of the "^p palette" hint at the footer's right end."""
NARROW_BELOW = 100
OPTIONAL = frozenset({"toggle_load", "pyspy", "analysis",
                      *(knob_action(k, 1) for k in vocab.knobs() if k.name in ("topk", "draft_tokens"))})
"""Actions whose footer hints go first when the terminal is narrow (help and the palette keep them)."""


class KeyFooter(Footer):
    DEFAULT_CSS = """
    KeyFooter.-narrow FooterKey.-optional { display: none; }
    KeyFooter.-compact FooterLabel { margin: 0 1 0 0; }
    """

    _width = 0

    def fit(self, width: int) -> None:
        """Shape the footer for a terminal `width` columns wide."""
        self._width = width
        self._shape()
        self.set_class(width < NARROW_BELOW, "-narrow")

    def _shape(self) -> None:
        # Roomy while every key fits with Textual's spacing (a replay's few keys at 120 columns);
        # else compact, and ctrl+p's hint goes (it stays a key, help lists it): 100 columns hold
        # every live key then.
        shown = [b for _, b, _, _ in self.screen.active_bindings.values() if b.show]
        roomy = sum(len(self.app.get_key_display(b)) + len(b.description) + 3 for b in shown) + PALETTE_HINT
        fits = roomy <= self._width
        self.compact = not fits
        self.show_command_palette = fits

    def compose(self):
        if self._width and self.is_attached:
            self._shape()
        for widget in super().compose():
            if isinstance(widget, FooterKey) and widget.action in OPTIONAL:
                widget.add_class("-optional")
            yield widget
