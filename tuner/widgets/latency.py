"""The latency panel: p50/p90/p99 of TTFT, inter-token latency, end-to-end and queue time over the
last window, the load driver's exact figures beside the server histogram's bucket ("p99 ≤ 40 ms"),
and one line saying what is missing (no latency metrics on the server, no open-loop load).

The percentiles are tuner.core.latency's (handed in as a frozen view by tuner.widgets.views); this
widget only lays them out. It must not read the store or compute a figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.console import Group
from rich.text import Text

from tuner.core.latency import ms_text
from tuner.widgets.view_widget import ViewWidget


@dataclass(frozen=True)
class LatencyRow:
    label: str
    """"TTFT", "ITL", "e2e", "queue"."""
    p50: float = math.nan
    p90: float = math.nan
    p99: float = math.nan
    """The load driver's exact percentiles (seconds); NaN without samples."""
    server_p99: str = ""
    """The server histogram's p99 bucket, e.g. "≤ 40 ms"; "" without one."""


@dataclass(frozen=True)
class LatencyView:
    rows: tuple[LatencyRow, ...] = ()
    window_s: float = 0.0
    requests: int = 0
    """Load requests wholly inside the window (the driver's figures are theirs)."""
    notes: tuple[str, ...] = ()
    """One line each: why a source is missing (no histograms, no open-loop load)."""


def _cell(v: float) -> str:
    return ms_text(v) if math.isfinite(v) else "–"


class LatencyPanel(ViewWidget[LatencyView]):
    VIEW = LatencyView

    def shape(self, v: LatencyView) -> tuple:
        return (len(v.rows), len(v.notes))

    def render(self) -> Group | Text:
        v = self._view
        if not v.rows and not v.notes:
            return Text("no latency readings yet", style="dim")
        lines: list[Text] = []
        if v.rows:
            lines.append(Text(f"{'':<6}{'p50':>8}{'p90':>9}{'p99':>9}  {'server p99':<11}", style="dim"))
            for r in v.rows:
                line = Text(f"{r.label:<6}", style="bold")
                line.append("".join(f"{_cell(x):>9}" for x in (r.p50, r.p90, r.p99))[1:])
                line.append(f"  {r.server_p99:<11}", style="dim" if not r.server_p99 else "")
                lines.append(line)
            lines.append(Text(f"last {v.window_s:g} s · load driver: {v.requests} requests (exact) · "
                              "server: its histogram's bucket", style="dim"))
        lines += [Text(n, style="#e0b040") for n in v.notes]
        return Group(*lines)
