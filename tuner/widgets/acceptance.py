"""Per-position acceptance bars: p_k (unconditional) as a bar and α_k = p_k / p_{k-1} beside it;
under them, when the server runs an adaptive controller, the tier it ran per batch bucket against
the tuner's best.

The numbers come from the store's `spec/accept_pos/<k>` series (see the design note's
"Acceptance"), and per batch-size / context bucket from `spec/<bucket>/...`; this widget only lays
them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tuner.widgets.fmt import hbar, is_num, num
from tuner.widgets.view_widget import ViewWidget

BAR_COLOR = "#8bc34a"
MAX_BUCKET_LINES = 8


@dataclass(frozen=True)
class AcceptView:
    accept_len: float = float("nan")
    """τ: mean tokens committed per verify, bonus token included."""
    positions: tuple[float, ...] = ()
    """p_1, p_2, …: the share of verifies that accepted at least k drafts."""
    steps: int | None = None
    buckets: tuple[tuple[str, int, tuple[float, ...]], ...] = ()
    """Per batch-size / context bucket: (range, verify rounds, p_1, p_2, …) over the same window."""
    controller: tuple[str, ...] = ()
    """The server's adaptive controller checked (tuner.tuning.controller_check): a title, then one
    line per batch bucket (the tier it ran, the tuner's best, the predicted tok/s lost)."""


class PositionBars(ViewWidget[AcceptView]):
    VIEW = AcceptView

    def shape(self, v: AcceptView) -> tuple:
        return (len(v.positions), v.steps == 0, len(v.buckets), len(v.controller))

    def render(self) -> Group | Text:
        body = self._render_acceptance()
        if not self._view.controller:
            return body
        title, *rows = self._view.controller
        # One line each, cut at the panel's edge, as the bucket lines.
        return Group(body, Text(title, style="bold", no_wrap=True, overflow="ellipsis"),
                     *(Text(r, style="dim" if "on the best" in r else "", no_wrap=True, overflow="ellipsis")
                       for r in rows[:MAX_BUCKET_LINES]))

    def _render_acceptance(self) -> Group | Text:
        view = self._view
        head = Text.assemble(("accept length ", "bold"), (num(view.accept_len, 2), f"bold {BAR_COLOR}"))
        if view.steps == 0:
            return Text.assemble(head, ("\ntier 0 (draft kept warm): nothing drafted", "dim"))
        if not view.positions:
            return Text.assemble(head, ("\nno verify rounds yet", "dim"))
        width = max(4, self.content_size.width - 18)
        table = Table.grid(padding=(0, 1))
        table.add_column(justify="right", width=3)
        table.add_column(width=width)
        table.add_column(justify="right", width=4)
        table.add_column(justify="right", width=6)
        prev = 1.0
        for k, p in enumerate(view.positions, start=1):
            alpha = p / prev if is_num(p) and prev > 0 else float("nan")
            table.add_row(
                Text(f"k{k}", style="dim"),
                Text(hbar(p, width), style=BAR_COLOR),
                num(p, 2),
                Text(f"α{num(alpha, 2)}", style="dim"),
            )
            prev = p if is_num(p) else 0.0
        if not view.buckets:
            return Group(head, table)
        # Where acceptance varies: one dim line per bucket (p_k only; α_k follows from them).
        # One line each, cut at the panel's edge: a wrapped count reads as the next bucket's.
        lines = [Text.assemble((f"{label:<16}", "dim"), (" ".join(num(p, 2) for p in ps), ""),
                               (f"  n={n}", "dim"), no_wrap=True, overflow="ellipsis")
                 for label, n, ps in view.buckets[:MAX_BUCKET_LINES]]
        return Group(head, table, Text("p_k by bucket", style="bold"), *lines)
