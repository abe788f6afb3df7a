"""A recording made by `specdecode-tune record` (the committed 60-s CPU engine one) opens in the
replay TUI: the setting changes and the capture are in its event log, and seeking moves through it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tuner.app import make_app
from tuner.commands.replay import open_replay

FIXTURE = Path(__file__).parent / "fixtures" / "cpu-engine.db"


def test_a_recording_from_record_replays_in_the_tui():
    async def scenario():
        session = open_replay(FIXTURE, start=5.0, paused=True)
        backend = session.backend
        assert backend.problem is None
        app = make_app(session, tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            header = str(app.main.query_one("#header").render())
            assert "+0:05.0" in header and "paused" in header
            for _ in range(4):
                await pilot.press("right")                # 10 s a press
            assert session.now() - backend.start_t == pytest.approx(45.0)
            events = app.main.query_one("#events").plain()
            assert "placement sharded→replicated" in events
            knobs = str(app.main.query_one("#knobs").render())
            assert "replicated" in knobs
            await pilot.press("right", "right")
            await pilot.pause()
            assert session.store.traces(), "the capture at the end is in the store"
    asyncio.run(scenario())
