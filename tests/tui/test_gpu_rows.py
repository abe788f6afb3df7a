"""The GPU panel stays readable with 8 GPUs: one line each, at the main screen's width and at a
narrow one (where the history column gives way first). The panel draws plain rows it is given."""

from __future__ import annotations

import asyncio
import math

import pytest
from textual.app import App, ComposeResult

from tuner.widgets.gpus import GpuRow, GpuTable, GpuView


def eight_gpus() -> GpuView:
    rows = []
    for i in range(8):
        history = tuple(50 + 45 * math.sin(i + k / 4) for k in range(30))
        rows.append(GpuRow(index=i, name=f"H200 r{i}", sm_pct=history[-1], sm_history=history,
                           mem_used=(40 + 10 * i) * 2**30, mem_total=140 * 2**30, power_w=300.0 + 50 * i,
                           power_limit_w=700.0, pcie_rx=1.5e9 if i % 2 else math.nan, pcie_tx=2e8,
                           nvlink_rx=4.2e10, nvlink_tx=4.1e10))
    return GpuView(tuple(rows))


class GpuApp(App[None]):
    CSS = "GpuTable { border: round $panel-lighten-2; padding: 0 1; }"

    def compose(self) -> ComposeResult:
        yield GpuTable(id="gpus")

    def on_mount(self) -> None:
        self.query_one(GpuTable).show(eight_gpus())


@pytest.mark.parametrize("width", [120, 70])
def test_eight_gpu_rows(width, snap_compare):
    assert snap_compare(GpuApp(), terminal_size=(width, 12))


def test_every_gpu_gets_exactly_one_line():
    async def scenario():
        app = GpuApp()
        async with app.run_test(size=(70, 14)) as pilot:
            await pilot.pause()
            table = app.query_one(GpuTable)
            assert table.size.height == 1 + 8   # the header and one line per GPU, no wrapping
    asyncio.run(scenario())
