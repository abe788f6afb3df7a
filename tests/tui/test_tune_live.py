"""Pilot tests of the tune screen against a real engine server on loopback (TP 2 on CPU): the
screen drives the live tuner from the app's timer to the end (progress, predicted ± vs measured,
fitted costs), enter applies the selected setting and the server confirms it, and closing the screen
while tuning stops the tuner and puts the starting setting back. A small space and budget keep each
run well under a minute."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from .helpers import wait_for
from tuner.app import make_app
from tuner.backends import connect
from tuner.commands.attach import builtin_prompts
from tuner.core.session import Session
from tuner.screens.tune import TuneScreen

pytestmark = pytest.mark.slow
STEPS, PLACEMENT = "speculative_num_steps", "speculative_draft_placement"
START = {STEPS: 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, PLACEMENT: "sharded"}


def server_active(url: str) -> dict:
    """What the server itself says it runs (internal_states[0]), read past the TUI."""
    return httpx.get(url + "/server_info", timeout=30).json()["internal_states"][0]


def put_back(url: str) -> None:
    """The session's engine is shared: leave it as the other tests expect it."""
    httpx.post(url + "/set_internal_state", json={"server_args": START}, timeout=60).raise_for_status()


def tune_app(url: str, budget_s: float):
    session = Session(connect(url))
    app = make_app(session, load=2, prompts=builtin_prompts(), max_new_tokens=32,
                   tune_budget_s=budget_s, tune_max_steps=2)
    app.tune.placements = ("sharded",)      # chains 1..2 and speculation off: 3 settings
    return session, app


def test_tune_screen_runs_the_tuner_and_applies_a_row(engine):
    put_back(engine.url)

    async def scenario():
        session, app = tune_app(engine.url, budget_s=20)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(session.active_config().get(STEPS), int), why="first read-back")
            assert ("u", "tune", "tune") in app.key_help()
            await pilot.press("u")
            screen = app.screen
            assert isinstance(screen, TuneScreen) and app.driver.tuner is screen.tuner
            # The knob keys belong to the tuner while its screen is up.
            assert app.check_action("knob", ("steps", 1)) is False
            seen = set()
            # The tuner keeps its own budget (20 s of its clock); the wait only bounds a hang, so a
            # busy machine that stretches the tuner's iterations does not fail it.
            await wait_for(pilot, lambda: seen.add(round(screen.view.progress, 2)) or screen.view.state == "done",
                           timeout=300, why="the tuning to finish")
            view = screen.view
            assert len(seen) > 3 and view.progress == 1.0
            rows = {r.label: r for r in view.rows}
            assert {"off", "s1 k1 N2 sharded", "s2 k1 N3 sharded"} <= set(rows)
            # Every setting is predicted; the tuner measures only those that could still win
            # (tuning.probing), and within its budget: on a busy machine not every one.
            space = ("off", "s1 k1 N2 sharded", "s2 k1 N3 sharded")   # the start (s3) is outside it
            measured = [rows[label] for label in space if rows[label].measured == rows[label].measured]
            assert measured, "the tuner measured nothing"
            for label in space:
                assert rows[label].predicted > 0 and rows[label].sd > 0, rows[label]
            # A measured row shows its measurement. How near the prediction lands is not asserted
            # here: on a busy 2-core host it depends on which process the OS slowed during a probe
            # (fresh-clone CI runs read s1 at 51 against 77 ± 38 predicted, and at 61 against
            # 107 ± 21). The cost model's fit is checked on constructed phase records in
            # tests/tuning/test_cost_model.py, and its accuracy is a benchmark figure
            # (benchmarks/tuner_vs_grid.py).
            assert all(r.measured > 0 for r in measured), measured
            assert any(line.startswith("sharded (bs ") for line in view.costs)
            assert any("acceptance p_k" in line for line in view.costs)
            status = str(screen.query_one("#tune-status").render())
            assert "done" in status and "best" in status
            table = str(screen.query_one("#tune-table").render_line(1))
            assert "±" in table
            # enter applies the selected row; the server itself confirms.
            target = next(i for i, r in enumerate(view.rows) if r.label == "s1 k1 N2 sharded")
            screen.query_one("#tune-table").move_cursor(row=target)
            await pilot.press("enter")
            await wait_for(pilot, lambda: server_active(engine.url)[STEPS] == 1, why="steps 1 applied")
            await wait_for(pilot, lambda: session.active_config().get(STEPS) == 1, why="the TUI sees steps 1")
            tuner = app.driver.tuner
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.driver.tuner is None and not tuner.feed._thread.is_alive(),
                           why="the tuner closed")
            assert not isinstance(app.screen, TuneScreen)
            assert app.check_action("steps", (1,)) is True
            events = [e.kind for e in session.store.events()]
            assert "tuning_started" in events and "tuning_finished" in events
    try:
        asyncio.run(scenario())
    finally:
        put_back(engine.url)


def test_closing_the_screen_while_tuning_puts_the_starting_setting_back(engine):
    put_back(engine.url)

    async def scenario():
        session, app = tune_app(engine.url, budget_s=120)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(session.active_config().get(STEPS), int), why="first read-back")
            await pilot.press("u")
            tuner = app.driver.tuner
            # The first probe is the starting setting; the second changes what the server runs.
            # Bounded only against a hang: the first probe's settle and windows took over 40 s on a
            # busy 2-core machine (a fresh-clone CI run).
            await wait_for(pilot, lambda: session.active_config().get(STEPS) != 3, timeout=180,
                           why="the tuner to apply a probe setting")
            await pilot.press("escape")
            assert app.driver.tuner_released and tuner.state == "running"
            await wait_for(pilot, lambda: app.driver.tuner is None, timeout=30, why="the tuner to finish after closing")
            assert tuner.state == "done" and tuner.result.stop_reason == "cancelled"
            await wait_for(pilot, lambda: not tuner.feed._thread.is_alive(), why="the feed thread to stop")
            assert server_active(engine.url)[STEPS] == 3
            await wait_for(pilot, lambda: session.active_config().get(STEPS) == 3, why="the TUI sees steps 3")
    try:
        asyncio.run(scenario())
    finally:
        put_back(engine.url)


def test_the_tune_keys_space_takes_trees_when_topk_changes_live(engine):
    """--tune-topk / --tune-draft-tokens reach the tune key's space: trees for each (topk, N) the
    candidate pool allows, next to the chains and speculation off; without draft-token counts, chains."""
    session = Session(connect(engine.url))
    try:
        app = make_app(session, tune_max_steps=3, tune_topks=(1, 4), tune_draft_tokens=(8,))
        app.tune.placements = ("sharded",)
        space = {(s.steps, s.topk, s.num_draft_tokens) for s in app.tune.space(session.backend)}
        chains = {(0, 1, 1), (1, 1, 2), (2, 1, 3), (3, 1, 4)}
        # steps 1, topk 4: a pool of 4 drafts cannot fill N - 1 = 7; steps 2 and 3 can.
        assert space == chains | {(2, 4, 8), (3, 4, 8)}
        assert {(s.steps, s.topk, s.num_draft_tokens) for s in make_app(session, tune_max_steps=3,
                tune_topks=(1, 4)).tune.space(session.backend) if s.placement == "sharded"} == chains
    finally:
        session.close()
