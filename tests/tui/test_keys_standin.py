"""Every TUI key over the real backend and Session, against the core's HTTP stand-in server
(tests/core/core_standin.py: real sockets on loopback, scripted replies): fast pilot tests of the
control path, `+` → `/set_internal_state` and back. The slow tests against a real
`serve --tp-size 2` (test_app_live.py) prove the same wiring end to end.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from probes.names import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK
from tuner.app import make_app
from tuner.backends import connect
from tuner.core.session import Session
from tuner.screens.help import HelpScreen
from tuner.widgets.knobs import KnobsPanel

from .helpers import wait_for

# The stand-in lives with the core's tests; load it by path so both folders share one file.
_spec = importlib.util.spec_from_file_location(
    "core_standin_for_tui", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)


@pytest.fixture
def standin():
    s = core_standin.StandIn().start()
    s.config.update(steps=3, topk=1, num_draft_tokens=4, placement="sharded")
    yield s
    s.stop()


def _args(standin) -> list[dict]:
    return [p.get("server_args", {}) for p in standin.posts]


async def _ready(pilot, session):
    await wait_for(pilot, lambda: isinstance(session.active_config().get(STEPS), int), why="the first read-back")


# key, the server_args it sends from steps 3 topk 1 N 4 sharded
KNOB_KEYS = [
    ("plus", {STEPS: 4}),
    ("minus", {STEPS: 2}),
    ("p", {PLACEMENT: "replicated"}),
]


@pytest.mark.parametrize("key, sent", KNOB_KEYS)
def test_a_knob_key_sends_its_change_and_the_readback_shows_it(standin, key, sent):
    async def scenario():
        session = Session(connect(standin.url))
        app = make_app(session, load=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await _ready(pilot, session)
            await pilot.press(key)
            await wait_for(pilot, lambda: sent in _args(standin), why=f"{key} posted {sent}")
            (k, v), = sent.items()
            await wait_for(pilot, lambda: session.active_config().get(k) == v, why=f"{k} {v} read back")
        session.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("key, sent", [("t", {TOPK: 2}), ("d", {DRAFT_TOKENS: 5})])
def test_tree_keys_send_topk_and_draft_tokens(standin, key, sent):
    async def scenario():
        session = Session(connect(standin.url))
        app = make_app(session, load=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await _ready(pilot, session)
            await pilot.press(key)
            # A tree change may carry the other tree knob with it; the key's own knob must be there.
            (k, v), = sent.items()
            await wait_for(pilot, lambda: any(a.get(k) == v for a in _args(standin)), why=f"{key} posted {k}={v}")
        session.close()
    asyncio.run(scenario())


def test_a_refusal_shows_the_servers_reason_and_nothing_changes(standin):
    async def scenario():
        standin.refuse_next = "speculative_num_steps 9 exceeds this engine's maximum 8"
        session = Session(connect(standin.url))
        app = make_app(session, load=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await _ready(pilot, session)
            await pilot.press("plus")
            knobs = app.main.query_one("#knobs", KnobsPanel)
            await wait_for(pilot, lambda: "exceeds this engine's maximum" in str(knobs.render()),
                           why="the reason in the knobs panel")
            assert session.active_config()[STEPS] == 3
        session.close()
    asyncio.run(scenario())


def test_l_stops_and_starts_the_load_driver(standin):
    async def scenario():
        session = Session(connect(standin.url))
        app = make_app(session, load=2)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: session.store.events("load_started"), why="the load driver started")
            await pilot.press("l")
            await wait_for(pilot, lambda: session.store.events("load_stopped"), why="l stopped the load")
            await pilot.press("l")
            await wait_for(pilot, lambda: len(session.store.events("load_started")) == 2, why="l started it again")
        session.close()
    asyncio.run(scenario())


def test_help_palette_and_quit(standin):
    async def scenario():
        session = Session(connect(standin.url))
        app = make_app(session, load=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await _ready(pilot, session)
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), why="? opens the help")
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), why="esc closes the help")
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None or not app.is_running, why="q quits")
        session.close()
    asyncio.run(scenario())


def test_a_c_and_u_on_a_server_without_profiling(standin):
    """a with no capture says so; c against a server that refuses /start_profile shows its reply in
    one line; u opens the tune screen (starting the load: tuning needs traffic) and esc closes it."""
    from tuner.screens.tune import TuneScreen

    async def scenario():
        session = Session(connect(standin.url))
        app = make_app(session, load=0)
        notes = lambda: [n.message for n in app._notifications]
        async with app.run_test(size=(120, 40)) as pilot:
            await _ready(pilot, session)
            await pilot.press("a")
            await wait_for(pilot, lambda: any("no analysed trace yet" in m for m in notes()), why="a says why")
            await pilot.press("c")
            await wait_for(pilot, lambda: any("/start_profile refused (404)" in m for m in notes()),
                           why="c shows the server's refusal")
            assert all("\n" not in m for m in notes())
            await pilot.press("u")
            await wait_for(pilot, lambda: isinstance(app.screen, TuneScreen), why="u opens the tune screen")
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, TuneScreen), why="esc closes it")
        session.close()
    asyncio.run(scenario())
