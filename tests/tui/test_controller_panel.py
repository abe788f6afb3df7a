"""The server's own adaptive controller checked in the TUI: the acceptance panel's section with the
tier it ran per batch bucket against the tuner's best (tuner.tuning.controller_watch →
`controller_check` event → views.controller_lines). Pilot tests over the core's HTTP stand-in
(real sockets on loopback, scripted replies and phase records)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
from rich.console import Console

from tests.tuning.synth import Stream, Truth
from tuner.app import make_app
from tuner.backends import connect
from tuner.core.session import Session
from tuner.tuning.settings import Setting

from .helpers import wait_for

_spec = importlib.util.spec_from_file_location(
    "core_standin_for_controller", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)


def _panel_text(app) -> str:
    panel = app.main.query_one("#positions")
    console = Console(width=max(panel.content_size.width, 60), record=True, color_system=None)
    console.print(panel.render())
    return console.export_text()


@pytest.fixture
def sglang_adaptive():
    s = core_standin.StandIn(kind="sglang", adaptive=True).start()
    yield s
    s.stop()


def test_sglang_without_the_plugin_shows_the_gauges_tier_labelled_approximate(sglang_adaptive):
    async def scenario() -> str:
        session = Session(connect(sglang_adaptive.url))
        app = make_app(session, load=0)
        app.driver.watch.every_s = 0.2
        async with app.run_test(size=(140, 44)) as pilot:
            await wait_for(pilot, lambda: "adaptive controller" in _panel_text(app), why="the controller section")
            text = _panel_text(app)
        session.close()
        return text

    text = asyncio.run(scenario())
    assert "adaptive controller vs tuned (approximate)" in text
    # The stand-in's gauges: 2 running requests, spec_num_steps 3.
    assert "batch 2–3" in text and "ran s3 (100%)" in text and "no fit" in text


@pytest.fixture
def adaptive_engine():
    s = core_standin.StandIn(kind="refengine", adaptive=True).start()
    yield s
    s.stop()


def _controller_ran(standin, truth: Truth, tiers: list[tuple[int, int]]) -> None:
    """Phase records as an adaptive engine writes them: its tiers switch inside one epoch."""
    stream = Stream(truth, seed=5)
    stream.epoch = standin.config["epoch"]
    for steps, n in tiers:
        for r in stream.records(Setting(steps), n, bs=1, new_epoch=False):
            standin.seq += 1
            r["seq"], r["adaptive"] = standin.seq, True
            standin.records.append(r)


def test_our_engine_shows_the_tier_it_ran_against_the_best_with_the_tok_s_lost(adaptive_engine):
    # Verify is costly against drafting: the shallow tiers win, and the controller sat at 5.
    truth = Truth(verify_n=2.5, step=1.5, off_verify=9.0)

    async def scenario() -> str:
        session = Session(connect(adaptive_engine.url))
        app = make_app(session, load=0)
        watch = app.driver.watch
        watch.every_s = 0.2
        async with app.run_test(size=(140, 44)) as pilot:
            # The feed takes what is there on its first read as history: script the records after it.
            await wait_for(pilot, lambda: watch._mode == "records" and watch._feed._cursor is not None,
                           why="the watch reading the phase stream")
            _controller_ran(adaptive_engine, truth, [(5, 120), (1, 60), (2, 60), (5, 60)])
            await wait_for(pilot, lambda: "best s" in _panel_text(app), why="the controller section with a best")
            text = _panel_text(app)
        session.close()
        return text

    text = asyncio.run(scenario())
    assert "adaptive controller vs tuned" in text and "approximate" not in text
    line = next(x for x in text.splitlines() if x.startswith("batch 1 ") and " ran " in x)
    assert "ran s5" in line and ("best s1" in line or "best s2" in line)
    lost = float(line.split("−")[1].split()[0])
    truth_loss = max(truth.tok_s(Setting(s), 1) for s in (1, 2)) - truth.tok_s(Setting(5), 1)
    assert lost == pytest.approx(truth_loss, rel=0.25)
    # The title carries the whole traffic's cost: one bucket here, so its own share lost.
    title = next(x for x in text.splitlines() if x.startswith("adaptive controller vs tuned"))
    overall = float(title.split("−")[1].split("%")[0])
    assert title.endswith("% overall") and overall == pytest.approx(float(line.split("(")[-1].split("%")[0]), abs=0.6)
