"""The replay keys over the committed recording: pause, step, seek and speed move the virtual clock,
the header says where the replay is, and the controls of a live server are hidden and inert."""

from __future__ import annotations

import asyncio

import pytest

from tuner.app import make_app
from tuner.commands.replay import open_replay

from .scenarios import FIXTURE, SIZE


def header(app) -> str:
    return str(app.main.query_one("#header").render())


def test_pause_step_seek_and_speed():
    async def scenario():
        session = open_replay(FIXTURE, start=20.0, paused=True)
        backend = session.backend
        app = make_app(session, tick_s=None)
        async with app.run_test(size=SIZE) as pilot:
            assert "+0:20.0" in header(app) and "‖ paused" in header(app)
            await pilot.press("full_stop")
            assert session.now() - backend.start_t == pytest.approx(21.0)
            await pilot.press("right")
            assert session.now() - backend.start_t == pytest.approx(31.0)
            # The seek refilled the store from the recording: the change at +24.7 s is in the log.
            assert "now running placement sharded→rank0" in app.main.query_one("#events").plain()
            await pilot.press("left", "left", "left", "left")
            assert session.now() == pytest.approx(backend.start_t), "seeking stops at the start"
            await pilot.press("greater_than_sign", "greater_than_sign")
            assert backend.speed == 4.0 and "4×" in header(app)
            await pilot.press("less_than_sign")
            assert backend.speed == 2.0
            await pilot.press("space")
            assert not backend.paused and "▶ replay" in header(app)
            await pilot.press("space")
            assert backend.paused
    asyncio.run(scenario())


def test_live_controls_are_hidden_and_inert_on_a_replay():
    async def scenario():
        session = open_replay(FIXTURE, start=30.0, paused=True)
        app = make_app(session, tick_s=None)
        async with app.run_test(size=SIZE) as pilot:
            before = session.active_config()
            await pilot.press("plus", "p", "l", "c", "y")
            await pilot.pause()
            assert session.active_config() == before
            assert not any(w.group in ("control", "load", "capture", "pyspy") for w in app.workers)
            knobs = str(app.main.query_one("#knobs").render())
            assert " + " not in knobs and "rank0" in knobs
            assert app.main.query_one("#knobs-panel").border_title == "setting"
            shown = {b.binding.action for b in app.active_bindings.values() if b.enabled}
            assert "pause" in shown and not any(a.startswith("knob(") for a in shown)
    asyncio.run(scenario())
