"""The app over a real Session with no server: keys that need a server say why, help and palette work.

No server here on purpose: this is what an operator sees before anything answers. Records are put
on the session's bus the way samplers put them.
"""

from __future__ import annotations

import asyncio

from textual.command import CommandPalette

from tuner.app import make_app
from tuner.core import series as S
from tuner.core.records import Event, Sample
from tuner.core.session import Session
from tuner.screens.help import HelpScreen
from tuner.widgets.knobs import KnobsPanel

ACTIVE = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
          "speculative_draft_placement": "sharded"}


def run(coro):
    return asyncio.run(coro)


def test_a_knob_without_a_server_says_why_and_sends_nothing():
    async def scenario():
        session = Session()
        session.put(Event(session.now(), "server_info", {"kind": "refengine", "active": ACTIVE}))
        app = make_app(session, tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            app.tick()
            await pilot.press("plus")
            await pilot.pause()
            notes = [n.message for n in app._notifications]
            assert any("no server to change" in m for m in notes), notes
            assert app.control.pending == ""
            knobs = app.main.query_one("#knobs", KnobsPanel)
            assert "no server to change" in str(knobs.render())
            assert not any(w.group == "control" for w in app.workers)
    run(scenario())


def test_help_lists_the_keys_and_closes():
    async def scenario():
        app = make_app(Session(), tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            keys = {k: action for k, action, _ in app.key_help()}
            assert keys["+"] == "steps" and keys["p"] == "placement" and keys["c"] == "capture_trace"
            assert "space" not in keys, "replay keys are hidden on a live session"
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen)
    run(scenario())


def test_palette_offers_the_operator_commands():
    async def scenario():
        app = make_app(Session(), tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for wanted in ("More draft steps", "Next draft placement", "Capture a trace", "Keys and panels"):
                assert wanted in titles
            await pilot.press("ctrl+p")
            await pilot.pause()
            assert isinstance(app.screen, CommandPalette)
    run(scenario())


def test_panels_follow_the_store_revision_not_each_sample():
    async def scenario():
        session = Session()
        app = make_app(session, tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            t = session.now()
            session.bus.put_many([Sample(t, S.SERVER_TOK_PER_S, 42.0),
                                  Event(t, "server_info", {"kind": "refengine", "active": ACTIVE})])
            before = session.store.revision
            app.tick()
            await pilot.pause()
            assert session.store.revision == before + 1
            legend = str(app.main.query_one("#throughput-legend").render())
            assert "server 42.0" in legend
            header = str(app.main.query_one("#header").render())
            assert "steps 3 · topk 1 · draft 4 · sharded" in header
    run(scenario())


def test_the_event_log_shows_a_change_that_arrives_after_a_later_stamped_event():
    # Under load the read-back's event can reach the store before the phase stream's config change,
    # which is stamped with the (earlier) time of its iteration: the log must still show it.
    async def scenario():
        session = Session()
        session.put(Event(1000.0, "server_info", {"kind": "refengine", "active": ACTIVE}))
        app = make_app(session, tick_s=None)
        async with app.run_test(size=(120, 40)) as pilot:
            session.put(Event(1002.0, "config_requested", {"changes": {"speculative_num_steps": 4}}))
            session.put(Event(1004.0, "config_active", {"active": {**ACTIVE, "speculative_num_steps": 4}}))
            app.tick()
            await pilot.pause()
            session.put(Event(1003.0, "config_changed", {"old": ACTIVE, "new": {**ACTIVE, "speculative_num_steps": 4}}))
            app.tick()
            await pilot.pause()
            assert "now running steps 3→4" in app.main.query_one("#events").plain()
    run(scenario())
