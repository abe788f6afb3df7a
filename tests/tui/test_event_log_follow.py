"""The event log keeps its newest line in view while the panels around it grow and shrink, stops
following only when the operator scrolls up, and follows again once they scroll back down.

A real app over a real Session (no server: events are put on the session's bus as producers put
them); what counts is the terminal as drawn, read back from the compositor.
"""

from __future__ import annotations

import asyncio

from textual.events import MouseScrollDown, MouseScrollUp

from tuner.app import make_app
from tuner.core.session import Session
from tuner.widgets.event_log import EventLog

from .helpers import screen_lines


def shown(app, text: str) -> bool:
    return any(text in row for row in screen_lines(app))


def test_the_newest_event_stays_visible_while_neighbours_grow_and_shrink():
    async def scenario():
        session = Session()
        app = make_app(session, tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            log = app.main.query_one("#events", EventLog)
            n = 0

            async def event() -> str:
                nonlocal n
                n += 1
                session.note(f"event number {n:03d}")
                app.tick()
                await pilot.pause()
                await pilot.pause()
                return f"event number {n:03d}"

            for _ in range(30):            # more lines than the panel holds
                await event()
            # The panels above the log change height as their contents do (a refusal, the A/B's
            # lines, a what-if reason); the log's own height follows.
            for neighbour, height in (("#ab-panel", 12), ("#ab-panel", 4), ("#phases-panel", 14),
                                      ("#phases-panel", "auto"), ("#ab-panel", 10), ("#ab-panel", "auto")):
                app.main.query_one(neighbour).styles.height = height
                await pilot.pause()
                newest = await event()
                assert shown(app, newest), f"{newest} not on screen after {neighbour} height {height}"
                assert log.follow
    asyncio.run(scenario())


def test_only_the_operators_scroll_stops_and_resumes_following():
    async def scenario():
        session = Session()
        app = make_app(session, tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            log = app.main.query_one("#events", EventLog)
            for i in range(30):
                session.note(f"line {i:03d}")
            app.tick()
            await pilot.pause()
            await pilot.pause()
            assert shown(app, "line 029")
            await pilot._post_mouse_events([MouseScrollUp], "#events", offset=(2, 1))
            assert not log.follow
            session.note("line 030")
            app.tick()
            await pilot.pause()
            assert not shown(app, "line 030"), "the operator is reading older lines: the log holds still"
            for _ in range(40):
                await pilot._post_mouse_events([MouseScrollDown], "#events", offset=(2, 1))
                if log.follow:
                    break
            assert log.follow, "back at the end, the log follows again"
            session.note("line 031")
            app.tick()
            await pilot.pause()
            await pilot.pause()
            assert shown(app, "line 031")
    asyncio.run(scenario())
