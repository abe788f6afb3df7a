"""The A/B readout after a change: tok/s vs the previous setting and vs the baseline (the setting at
attach, or one the operator pinned), and accept length vs the previous setting, with the intervals.

The comparison itself (warm-up drop, 1-s windows, bootstrap interval, "not yet" rule) is the
headless core's; this widget only prints its result, so the TUI and the report agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.text import Text

from tuner.core import windows as W
from tuner.widgets.fmt import is_num, num
from tuner.widgets.view_widget import ViewWidget


@dataclass(frozen=True)
class Metric:
    name: str
    before: float = float("nan")
    after: float = float("nan")
    ratio: float = float("nan")
    lo: float = float("nan")
    hi: float = float("nan")
    short: str = ""
    """A shorter name for the interval line (e.g. "τ")."""
    lower_better: bool = False
    """A latency: a ratio above 1 is worse."""


@dataclass(frozen=True)
class ABView:
    change: str = ""
    """What changed, e.g. "steps 3 → 5"; "" before the first change."""
    ready: bool = False
    waiting: str = ""
    """Why it cannot tell yet, e.g. "2/5 windows after the change"."""
    metrics: tuple[Metric, ...] = ()
    """Rows: "vs previous" (tok/s), "vs baseline" (tok/s; absent while the baseline is the previous
    setting), "accept len" (vs previous), "ITL p99 ms" (vs previous, the load driver's requests:
    tuner.core.latency_ab; lower is better)."""
    baseline: str = ""
    """The baseline in words, e.g. "baseline sharded (at attach) · b pins"; the panel's subtitle."""
    baseline_note: str = ""
    """Said in the "vs baseline" row instead of figures, e.g. "not yet (2/5 windows)", "this is it"."""


def _change(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%" if is_num(ratio) else "n/a"


def _whole(ratio: float) -> str:
    """An interval end in whole percent without the sign's unit: the 95 % line must fit one line."""
    return f"{(ratio - 1) * 100:+.0f}" if is_num(ratio) else "n/a"


VERDICT_TEXT = {W.BETTER: Text("better", style="bold #8bc34a"), W.WORSE: Text("worse", style="bold #d96e6e"),
                W.WITHIN_NOISE: Text("unclear", style="dim")}


def _verdict(m: Metric) -> Text:
    if not (is_num(m.lo) and is_num(m.hi)):
        return Text("")
    said = W.judge(m.lo, m.hi)
    if m.lower_better:
        said = {W.BETTER: W.WORSE, W.WORSE: W.BETTER}.get(said, said)
    return VERDICT_TEXT[said].copy()


class ABReadout(ViewWidget[ABView]):
    VIEW = ABView

    def shape(self, v: ABView) -> tuple:
        return (bool(v.change), v.ready, len(v.metrics), any(is_num(m.lo) for m in v.metrics))

    def render(self) -> Group | Text:
        view = self._view
        if not view.change:
            return Text("change a setting to compare before vs after", style="dim")
        title = Text.assemble(("tok/s after ", "dim"), (view.change, "bold"))
        if not view.ready:
            return Text.assemble(title, "\n", ("not yet", "bold #e0b040"),
                                 (f" — {view.waiting}" if view.waiting else "", "dim"))
        lines = [title]
        intervals = []
        for m in view.metrics:
            lines.append(metric_line(m))
            if is_num(m.lo):
                intervals.append(f"{m.short + ' ' if m.short else ''}{_whole(m.lo)}…{_whole(m.hi)}")
        if view.baseline_note:
            lines.append(Text.assemble((f"{'vs baseline':<11} ", "bold"), (view.baseline_note, "dim")))
        if intervals:
            lines.append(Text("95%: " + ", ".join(intervals), style="dim"))
        return Group(*lines)


def metric_line(m: Metric) -> Text:
    """`vs previous  52.1→76.3   +46.5% better`: 37 columns (the right column holds 39 at 100x30)."""
    digits = 2 if is_num(m.before) and m.before < 10 else 1
    line = Text(f"{m.name:<11} ", style="bold")
    line.append(f"{num(m.before, digits):>5}→{num(m.after, digits):<5}")
    line.append(f"{_change(m.ratio):>7}", style="bold")
    line.append(" ")
    line.append(_verdict(m))
    return line
