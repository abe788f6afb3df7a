"""The "what if the draft left the TP group" line under the phase split.

Prints a `WhatIfReadout` (tuner.tuning.what_if_now computes it from the store with the cost
model's what_if); this widget does no arithmetic beyond turning ratios into percentages.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tuner.tuning.what_if_now import WhatIfReadout
from tuner.widgets.fmt import is_num, num

TITLE = "draft off the TP group"


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f}%" if is_num(ratio) else "n/a"


def what_if_text(view: WhatIfReadout) -> Text:
    """Title and predicted change, then tok/s, then the basis; or title, n/a and the reason."""
    head = Text(TITLE, style="bold")
    if not view.available:
        return head + Text.assemble("  ", ("n/a", "bold"), "\n", (view.reason, "dim"))
    lo, hi = view.gain()
    color = "#8bc34a" if lo > 1.0 else "#d96e6e" if hi < 1.0 else "#e0b040"
    head.append("  ")
    head.append(f"{_pct(lo)}…{_pct(hi)}", style=f"bold {color}")
    head.append(f"\n{num(view.tok_s_low)}–{num(view.tok_s)} tok/s vs {num(view.tok_s_now)} now")
    head.append(f"\n{view.placement.replace(' / ', '/')} · collectives {view.comm_share * 100:.0f}% of draft",
                style="dim")
    return head


class WhatIfLine(Static):
    DEFAULT_CSS = "WhatIfLine { height: auto; margin-top: 1; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._view = WhatIfReadout("waiting for the first readings")

    @property
    def view(self) -> WhatIfReadout:
        return self._view

    def show(self, view: WhatIfReadout) -> None:
        if view != self._view:
            # Wrapping depends on the text's length: a new layout only when the words can change.
            self.refresh(layout=view.available != self._view.available or view.reason != self._view.reason)
            self._view = view

    def render(self) -> Text:
        return what_if_text(self._view)
