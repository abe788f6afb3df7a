"""Prefill in the TUI end to end: a recording written by the real Recorder (tests/report/synthetic.py,
with a prefill phase) replayed into the app, whose iteration panel draws prefill as its own row."""

from __future__ import annotations

import asyncio

from rich.console import Console

from tests.report.synthetic import FIG, write
from tuner.app import make_app
from tuner.commands.replay import open_replay

from .scenarios import SIZE


def test_replayed_prefill_is_its_own_row_of_the_iteration_panel(tmp_path):
    path = write(tmp_path / "prefill.db")

    async def scenario() -> str:
        app = make_app(open_replay(path, start=20.0, paused=True), tick_s=None)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            panel = app.main.query_one("#phases")
            console = Console(width=panel.content_size.width, record=True, color_system=None)
            console.print(panel.render())
            return console.export_text()

    text = asyncio.run(scenario())
    rows = [line.split() for line in text.splitlines()]
    prefill = next(r for r in rows if r[1:2] == ["prefill"])
    want = FIG["A"]["phase"]["prefill"]
    wall = sum(FIG["A"]["phase"].values())
    assert prefill[2:] == [f"{want:.2f}", f"{want / wall * 100:.1f}%"]
    # Drawn first, before the draft, and not counted again in other / idle.
    assert rows.index(prefill) < next(i for i, r in enumerate(rows) if r[1:2] == ["draft"])
    idle = next(r for r in rows if r[1:3] == ["other", "/"])
    assert idle[4] == f"{FIG['A']['phase']['other']:.2f}"
