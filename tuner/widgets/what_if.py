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


def what_if_text(view: WhatIfReadout, basis: bool = True) -> Text:
    """Title, then one line per placement (its change and tok/s, or n/a, and what it costs in
    words), then the basis (left out on a short terminal); or title, n/a and the reason."""
    head = Text(TITLE, style="bold")
    if not view.available:
        return head + Text.assemble("  ", ("n/a", "bold"), "\n", (view.reason, "dim"))
    for p in view.placements:
        head.append(f"\n{p.placement:<11}")
        if not is_num(p.tok_s):
            head.append("n/a", style="bold")
        else:
            lo, hi = p.tok_s_low / view.tok_s_now, p.tok_s / view.tok_s_now
            color = "#8bc34a" if lo > 1.0 else "#d96e6e" if hi < 1.0 else "#e0b040"
            head.append(f"{_pct(lo)}…{_pct(hi)}", style=f"bold {color}")
            if not p.note:
                head.append(f"  {num(p.tok_s_low)}–{num(p.tok_s)} tok/s")
        if p.note:
            head.append(f": {p.note}", style="dim")
    if basis:
        # "model": the cost model's own tok/s for the setting now, which the ranges are relative to
        # (the chart's figures are 2-s means of the server's and the client's counts).
        head.append(f"\nvs model {num(view.tok_s_now)} tok/s now · collectives {view.comm_share * 100:.0f}% "
                    "of the draft", style="dim")
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

    compact = False
    """A short terminal: no basis line and no margin (the phase split above shows the share)."""

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self.styles.margin = (0, 0, 0, 0) if compact else (1, 0, 0, 0)
            self.refresh(layout=True)

    def render(self) -> Text:
        return what_if_text(self._view, basis=not self.compact)
