"""One row per GPU: SM activity (bar + recent history), memory, power, PCIe and NVLink traffic.

Designed to stay readable at 8 rows in a 40-line terminal: one line per GPU, fixed column widths,
NaN shown as "n/a" (nvitop's NA habit). It draws the rows it is given and never calls NVML.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from tuner.widgets.fmt import NA, bytes_rate, hbar, is_num, num, sparkline
from tuner.widgets.view_widget import ViewWidget

NAN = float("nan")


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str = ""
    """A short label, e.g. "H200 r1" (device and the server's TP rank on it)."""
    sm_pct: float = NAN
    sm_history: tuple[float, ...] = ()
    mem_used: float = NAN
    """Bytes."""
    mem_total: float = NAN
    power_w: float = NAN
    power_limit_w: float = NAN
    pcie_rx: float = NAN
    """Bytes per second, host to device."""
    pcie_tx: float = NAN
    nvlink_rx: float = NAN
    nvlink_tx: float = NAN


@dataclass(frozen=True)
class GpuView:
    rows: tuple[GpuRow, ...] = ()
    note: str = ""
    """Shown instead of rows when there are none (e.g. why NVML sees nothing)."""


def _level_style(fraction: float) -> str:
    if not is_num(fraction):
        return "dim"
    return "#8bc34a" if fraction < 0.6 else "#e0b040" if fraction < 0.9 else "#d96e6e"


class GpuTable(ViewWidget[GpuView]):
    VIEW = GpuView

    def shape(self, v: GpuView) -> tuple:
        return (len(v.rows), v.note)

    def render(self) -> Table | Text:
        view = self._view
        if not view.rows:
            return Text(view.note or "no GPU readings", style="italic dim")
        # Two layouts: the main screen's GPU panel is ~66 cells wide at 120 columns, so the
        # compact one must hold 8 rows there; wider panels add the device name and a longer history.
        wide = self.content_size.width >= 96
        bar_w, spark_w = (10, 16) if wide else (6, 8)
        table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, header_style="bold",
                      expand=False)
        table.add_column("gpu", no_wrap=True)
        table.add_column("SM active", no_wrap=True)
        table.add_column("recent", no_wrap=True)
        table.add_column("mem GiB", justify="right", no_wrap=True)
        table.add_column("power W", justify="right", no_wrap=True)
        table.add_column("PCIe ↓/↑", justify="right", no_wrap=True)
        table.add_column("NVLink ↓/↑", justify="right", no_wrap=True)
        for r in view.rows:
            sm = r.sm_pct / 100 if is_num(r.sm_pct) else NAN
            name = r.name if wide else r.name.split()[-1] if r.name else ""
            bar = hbar(sm, bar_w)
            filled = bar.rstrip(" ")
            sm_cell = Text(filled, style=_level_style(sm))
            sm_cell.append("·" * (bar_w - len(filled)), style="#444444")   # the track, so 6% reads as 6%
            sm_cell.append(f" {r.sm_pct:3.0f}%" if is_num(r.sm_pct) else f" {NA:>4}")
            mem_frac = r.mem_used / r.mem_total if is_num(r.mem_used) and is_num(r.mem_total) and r.mem_total else NAN
            pwr_frac = r.power_w / r.power_limit_w if is_num(r.power_w) and is_num(r.power_limit_w) else NAN
            table.add_row(
                f"{r.index} {name}".rstrip(),
                sm_cell,
                Text(sparkline(list(r.sm_history), spark_w, top=100.0), style="#4fb3d9"),
                Text(f"{_gib(r.mem_used)}/{_gib(r.mem_total)}", style=_level_style(mem_frac)),
                Text(f"{num(r.power_w, 0)}/{num(r.power_limit_w, 0)}", style=_level_style(pwr_frac)),
                f"{bytes_rate(r.pcie_rx)}/{bytes_rate(r.pcie_tx)}",
                f"{bytes_rate(r.nvlink_rx)}/{bytes_rate(r.nvlink_tx)}",
            )
        return table


def _gib(x: float) -> str:
    if not is_num(x):
        return NA
    g = x / 2**30
    return f"{g:.0f}" if g >= 10 else f"{g:.1f}"
