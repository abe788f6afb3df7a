"""Time-series charts drawn with plotext: tok/s (server and client count) and accept length, both
with a marker wherever the speculative setting changed.

The charts draw what they are given: x is seconds since the session started (never wall-clock),
y values may hold NaN for gaps. Choosing the window is the caller's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from textual.color import Color
from textual_plotext import PlotextPlot

from tuner.widgets.fmt import is_num

SERVER_COLOR = (79, 179, 217)
CLIENT_COLOR = (224, 176, 64)
ACCEPT_COLOR = (139, 195, 74)
LOG_COLOR = (170, 140, 220)      # SGLang's own log lines (managed mode)
MARKER_COLOR = (217, 110, 110)


@dataclass(frozen=True)
class Series:
    label: str
    t: tuple[float, ...]
    v: tuple[float, ...]
    color: tuple[int, int, int]


@dataclass(frozen=True)
class ChartView:
    series: tuple[Series, ...] = ()
    markers: tuple[tuple[float, str], ...] = ()
    """(t, short label) where the setting changed, e.g. (42.0, "s3→5")."""
    t_end: float = 0.0
    window_s: float = 60.0
    y_label: str = ""


def _runs(t: tuple[float, ...], v: tuple[float, ...]) -> list[tuple[list[float], list[float]]]:
    """Split a series at NaN so a gap (disconnect) shows as a gap, not a line across it."""
    runs: list[tuple[list[float], list[float]]] = []
    cur: tuple[list[float], list[float]] = ([], [])
    for x, y in zip(t, v):
        if is_num(y):
            cur[0].append(x)
            cur[1].append(y)
        elif cur[0]:
            runs.append(cur)
            cur = ([], [])
    if cur[0]:
        runs.append(cur)
    return runs


class TimeChart(PlotextPlot):
    """A plotext line chart over the last `window_s` seconds; call `show(view)`."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._view = ChartView()

    def show(self, view: ChartView) -> None:
        if view == self._view:
            return
        self._view = view
        self.replot()

    def on_resize(self) -> None:
        self.replot()

    def replot(self) -> None:
        view, plt = self._view, self.plt
        plt.clear_figure()
        plt.frame(False)
        plt.xaxes(True, False)
        plt.yaxes(True, False)
        t0 = max(0.0, view.t_end - view.window_s)
        x_hi = max(view.t_end, t0 + 1.0)
        plt.xlim(t0, x_hi)
        y_hi = 0.0
        for s in view.series:
            for xs, ys in _runs(s.t, s.v):
                keep = [(x, y) for x, y in zip(xs, ys) if x >= t0]
                if not keep:
                    continue
                y_hi = max(y_hi, max(y for _, y in keep))
                plt.plot([x for x, _ in keep], [y for _, y in keep], color=s.color, marker="braille")
        y_step = _nice_step(y_hi * 1.1 if y_hi > 0 else 1.0, max(2, min(5, self.size.height // 3)))
        y_hi = y_step * math.ceil((y_hi * 1.1 if y_hi > 0 else 1.0) / y_step)
        plt.ylim(0, y_hi)
        y_ticks = [i * y_step for i in range(int(round(y_hi / y_step)) + 1)]
        plt.yticks(y_ticks, [f"{y:g}" for y in y_ticks])
        canvas = self._canvas_rgb()
        shown = [(t, label) for t, label in view.markers if t0 <= t <= x_hi]
        cells_per_s = max(1, self.size.width - 8) / (x_hi - t0)   # minus the y axis labels
        for i, (t, label) in enumerate(shown):
            plt.vline(t, MARKER_COLOR)
            # A label runs to the next marker at most, so close changes stay readable.
            room = int(((shown[i + 1][0] if i + 1 < len(shown) else x_hi) - t) * cells_per_s) - 1
            if label and room >= 3:
                text = label if len(label) <= room else label[: room - 1] + "…"
                plt.text(text, t, y_hi * 0.97, color=MARKER_COLOR, background=canvas, alignment="left")
        ticks = _time_ticks(t0, x_hi)
        plt.xticks(ticks, [_tick_label(x) for x in ticks])
        plt.ylabel(view.y_label)
        self.refresh()


    def _canvas_rgb(self) -> tuple[int, int, int] | None:
        """The plot's own background, so marker labels sit on it rather than in a white box."""
        try:
            return Color.parse(self.app.theme_variables["surface"]).rgb
        except Exception:   # no app theme yet (first layout): plotext's default is fine
            return None


def _nice_step(span: float, n: int) -> float:
    """A 1, 2 or 5 times a power of ten step giving about n intervals over span."""
    raw = span / max(1, n)
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _time_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600) if span / s <= n), 7200)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) // step) + 1)]


def _tick_label(x: float) -> str:
    x = int(round(x))
    return f"{x // 60}:{x % 60:02d}" if x >= 60 else f"{x}s"
