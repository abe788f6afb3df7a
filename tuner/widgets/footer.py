"""The main screen's footer: every key on one line down to 100 columns, and the keys that matter
most (the knobs that move the demo, the tune screen, help, quit) on one line at 80.

Textual's Footer, compact and without the palette's hint below FULL_WIDTH columns; below
NARROW_BELOW the keys of OPTIONAL leave the footer too (they still work; help lists them). It draws the bindings the app
declares and adds none of its own.
"""

from __future__ import annotations

from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tuner.core import setting as vocab
from tuner.widgets.knobs import knob_action

FULL_WIDTH = 130
"""Columns from which the footer keeps Textual's roomy spacing."""
NARROW_BELOW = 100
OPTIONAL = frozenset({"toggle_load", "pyspy", "analysis",
                      *(knob_action(k, 1) for k in vocab.knobs() if k.name in ("topk", "draft_tokens"))})
"""Actions whose footer hints go first when the terminal is narrow (help and the palette keep them)."""


class KeyFooter(Footer):
    DEFAULT_CSS = """
    KeyFooter.-narrow FooterKey.-optional { display: none; }
    KeyFooter.-compact FooterLabel { margin: 0 1 0 0; }
    """

    def fit(self, width: int) -> None:
        """Shape the footer for a terminal `width` columns wide."""
        self.compact = width < FULL_WIDTH
        # ctrl+p stays a key (help lists it); its hint is the room the keys need at 100 columns.
        self.show_command_palette = width >= FULL_WIDTH
        self.set_class(width < NARROW_BELOW, "-narrow")

    def compose(self):
        for widget in super().compose():
            if isinstance(widget, FooterKey) and widget.action in OPTIONAL:
                widget.add_class("-optional")
            yield widget
