"""Pilot tests against a real engine server on loopback (TP 2 on CPU): the keys an operator presses
change what the server runs, a trace capture ends in the analysis screen, a refusal shows the
server's reason, and a killed server shows as disconnected and recovers after a restart."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from .helpers import Engine, click_hint, wait_for
from tuner.app import make_app
from tuner.backends import connect
from tuner.commands.attach import builtin_prompts
from tuner.core.session import Session
from tuner.screens.trace import TraceScreen, analysis_table

pytestmark = pytest.mark.slow
STEPS, PLACEMENT = "speculative_num_steps", "speculative_draft_placement"


def server_active(url: str) -> dict:
    """What the server itself says it runs (internal_states[0]), read past the TUI."""
    info = httpx.get(url + "/server_info", timeout=30).json()
    return info["internal_states"][0]


def header_text(app) -> str:
    return str(app.main.query_one("#header").render())


def test_keys_change_the_setting_and_the_server_confirms_it(engine):
    async def scenario():
        session = Session(connect(engine.url))
        app = make_app(session, load=2, prompts=builtin_prompts(), max_new_tokens=32)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(session.active_config().get(STEPS), int), why="first read-back")
            before = session.active_config()[STEPS]
            await pilot.press("plus")
            await wait_for(pilot, lambda: session.active_config().get(STEPS) == before + 1, why="steps+1 read back")
            assert server_active(engine.url)[STEPS] == before + 1
            assert f"steps {before + 1}" in header_text(app)
            old_placement = session.active_config()[PLACEMENT]
            await pilot.press("p")
            await wait_for(pilot, lambda: session.active_config().get(PLACEMENT) != old_placement,
                           why="placement read back")
            new_placement = session.active_config()[PLACEMENT]
            assert server_active(engine.url)[PLACEMENT] == new_placement
            await wait_for(pilot, lambda: "now running" in app.main.query_one("#events").plain(),
                           why="the change in the event log")
            # Put the server back the way the other tests expect it, with the mouse this time: the
            # knobs panel's "-" hint is a button.
            await click_hint(pilot, "#knobs", 0, " - ", landed=lambda: (
                app.control.pending or app.control.refused or session.active_config().get(STEPS) == before))
            await wait_for(pilot, lambda: session.active_config().get(STEPS) == before, why="steps back by click")
            # l stops the load driver and starts it again; the store sees both.
            await pilot.press("l")
            await wait_for(pilot, lambda: session.store.events("load_stopped"), why="load stopped by l")
            assert "off · l starts 2 concurrent" in str(app.main.query_one("#knobs").render())
            await pilot.press("l")
            await wait_for(pilot, lambda: len(session.store.events("load_started")) == 2, why="load started by l")
            while session.active_config().get(PLACEMENT) != old_placement:
                current = session.active_config().get(PLACEMENT)
                await pilot.press("p")
                await wait_for(pilot, lambda: session.active_config().get(PLACEMENT) != current, why="placement back")
    asyncio.run(scenario())


def test_a_refused_change_shows_the_servers_reason(engine):
    async def scenario():
        session = Session(connect(engine.url))
        app = make_app(session)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(session.active_config().get(STEPS), int), why="first read-back")
            before = dict(session.active_config())
            # topk 1 fixes draft tokens to steps + 1; asking for one more is refused by the server.
            await pilot.press("d")
            await wait_for(pilot, lambda: app.control.refused, why="the refusal")
            knobs = str(app.main.query_one("#knobs").render())
            assert "refused" in knobs and "draft" in app.control.refused
            reply = httpx.post(engine.url + "/set_internal_state",
                               json={"server_args": {"speculative_num_draft_tokens": before["speculative_num_draft_tokens"] + 1}},
                               timeout=30)
            server_reason = reply.json()["error"]["message"]
            assert server_reason in app.control.refused
            assert server_active(engine.url)["speculative_num_draft_tokens"] == before["speculative_num_draft_tokens"]
    asyncio.run(scenario())


def test_trace_capture_ends_in_the_analysis_screen(engine):
    async def scenario():
        session = Session(connect(engine.url))
        app = make_app(session, load=2, prompts=builtin_prompts(), max_new_tokens=32)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: session.store.window("server/tok_per_s").finite(), why="decode under load")
            await pilot.press("c")
            await wait_for(pilot, lambda: isinstance(app.screen, TraceScreen), timeout=180, why="the analysis screen")
            analysis = app.screen.analysis
            assert [r["rank"] for r in analysis["ranks"]] == [0, 1]
            assert analysis["mode"] == "cpu"
            headers = [c.header for c in analysis_table(analysis).columns]
            assert "rank 0" in headers and "rank 1" in headers
            # The capture also reached the store (so a recording and the report see it).
            await wait_for(pilot, lambda: session.store.events("trace_captured") and session.store.traces(),
                           timeout=10, why="the capture in the store")
            await pilot.press("escape")
    asyncio.run(scenario())


def test_a_killed_server_shows_disconnected_and_recovers_after_restart():
    server = Engine()
    try:
        async def scenario():
            session = Session(connect(server.url))
            app = make_app(session)
            async with app.run_test(size=(120, 40)) as pilot:
                await wait_for(pilot, lambda: "● connected" in header_text(app), why="connected")
                server.kill()
                await wait_for(pilot, lambda: "disconnected" in header_text(app), why="disconnected in the header")
                await pilot.press("plus")          # a change while down: a message, not a crash
                await wait_for(pilot, lambda: app.control.refused and not app.control.pending, why="the change refused with a reason")
                server.restart()
                await wait_for(pilot, lambda: "● connected" in header_text(app), timeout=120, why="reconnected")
                log = app.main.query_one("#events").plain()
                assert "disconnected" in log and "after" in log
        asyncio.run(scenario())
    finally:
        server.stop()
