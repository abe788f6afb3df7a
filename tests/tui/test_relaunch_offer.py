"""The TUI's managed-relaunch offer over the core's HTTP stand-in server (tests/core/core_standin.py,
real sockets on loopback) answering as SGLang 0.5.23 without the plugin, so topk changes only by a
relaunch. The relauncher is a scripted stand-in (it records what it is asked and can block, fail or
refuse): these are pilot tests of the offer/decline logic. The real relaunch of a real server
through `launch` is test_launch_relaunch.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import pytest

from probes.names import DRAFT_TOKENS, STEPS, TOPK
from tuner.app import make_app
from tuner.backends import connect
from tuner.core.events import EventKind
from tuner.core.records import Event
from tuner.core.relaunch import relaunch_changes
from tuner.core.session import Session
from tuner.screens.relaunch import RelaunchConfirm
from tuner.widgets.knobs import KnobsPanel

from .helpers import wait_for

_spec = importlib.util.spec_from_file_location(
    "core_standin_for_relaunch", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)


class ScriptedRelauncher:
    """A stand-in for tuner.backends.sglang.managed.ManagedRelaunch: records calls, puts the events
    the real one puts, blocks until `release` is set, then succeeds or raises `fail`."""

    def __init__(self, session: Session, refuse: str = "", fail: str = "") -> None:
        self.session, self.refuse, self.fail = session, refuse, fail
        self.proposed: list[dict] = []
        self.relaunched: list[dict] = []
        self.release = threading.Event()
        self.release.set()

    def proposal(self, changes):
        self.proposed.append(dict(changes))
        if self.refuse:
            raise ValueError(self.refuse)
        return ("Relaunch the server to apply it?\n  python -m sglang.launch_server …",
                "python -m sglang.launch_server --speculative-eagle-topk 2")

    def relaunch(self, changes, progress):
        self.relaunched.append(dict(changes))
        self.session.put(Event(self.session.now(), EventKind.RELAUNCH_STARTED, {"changes": dict(changes)}))
        progress("stopping the server")
        progress("[    3 s] Capture cuda graph begin")
        self.release.wait(30)
        if self.fail:
            self.session.put(Event(self.session.now(), EventKind.RELAUNCH_FAILED,
                                   {"changes": dict(changes), "error": self.fail}))
            raise RuntimeError(self.fail)
        self.session.put(Event(self.session.now(), EventKind.RELAUNCH_READY, {"changes": dict(changes), "seconds": 3.0}))


@pytest.fixture
def sglang():
    s = core_standin.StandIn(kind="sglang").start()
    yield s
    s.stop()


def _notes(app) -> list[str]:
    return [f"{n.title}: {n.message}" for n in app._notifications]


def _run(sglang, check, managed=True, **relauncher_kw):
    async def scenario():
        session = Session(connect(sglang.url))
        relauncher = ScriptedRelauncher(session, **relauncher_kw) if managed else None
        app = make_app(session, load=0, relauncher=relauncher)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: session.active_config().get(TOPK) == 1, why="the first read-back")
            await check(app, pilot, session, relauncher)
    asyncio.run(scenario())


def test_relaunch_changes_carry_the_tree_size():
    active = {STEPS: 3, TOPK: 1, DRAFT_TOKENS: 4}
    assert relaunch_changes(TOPK, 2, active) == {TOPK: 2, DRAFT_TOKENS: 4}
    assert relaunch_changes(TOPK, 1, {**active, TOPK: 2}) == {TOPK: 1}        # a chain derives it
    assert relaunch_changes(STEPS, 4, active) == {STEPS: 4}
    assert relaunch_changes(DRAFT_TOKENS, 5, active) == {DRAFT_TOKENS: 5}
    assert relaunch_changes(TOPK, 2, {}) == {TOPK: 2}                         # unknown: the launch says


def test_declining_changes_nothing(sglang):
    async def check(app, pilot, session, relauncher):
        knobs = str(app.main.query_one("#knobs", KnobsPanel).render())
        assert "by relaunch" in knobs and "cannot change" not in knobs
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, RelaunchConfirm), why="t offers a relaunch")
        assert app.screen.command.endswith("--speculative-eagle-topk 2")
        assert relauncher.proposed == [{TOPK: 2, DRAFT_TOKENS: 4}]
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, RelaunchConfirm), why="n closes the offer")
        await wait_for(pilot, lambda: any("not relaunched" in n for n in _notes(app)), why="the decline said")
        assert relauncher.relaunched == [] and sglang.posts == []
        assert not session.store.events((EventKind.RELAUNCH_STARTED, EventKind.RELAUNCH_READY))
    _run(sglang, check)


def test_confirming_relaunches_with_progress_and_holds_the_other_keys(sglang):
    async def check(app, pilot, session, relauncher):
        relauncher.release.clear()
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, RelaunchConfirm), why="t offers a relaunch")
        await pilot.press("y")
        bar = lambda: str(app.main.query_one("#capture-bar").render())
        await wait_for(pilot, lambda: "Capture cuda graph begin" in bar(), why="the relaunch's progress")
        assert "topk 2, draft 4" in bar()
        assert app.check_action("knob", ("topk", 1)) is False and app.check_action("capture_trace", ()) is False
        await pilot.press("plus")                       # held: nothing offered, nothing sent
        assert relauncher.proposed == [{TOPK: 2, DRAFT_TOKENS: 4}] and sglang.posts == []
        relauncher.release.set()
        await wait_for(pilot, lambda: not app.control.relaunching, why="the relaunch finished")
        await wait_for(pilot, lambda: "relaunched with" in app.main.query_one("#events").plain(),
                       why="the outcome in the event log")
        assert relauncher.relaunched == [{TOPK: 2, DRAFT_TOKENS: 4}]
        assert any("relaunched with topk 2, draft 4" in n for n in _notes(app))
        assert bar() == "" and app.check_action("knob", ("topk", 1)) is not False
    _run(sglang, check)


def test_a_failed_relaunch_is_said(sglang):
    async def check(app, pilot, session, relauncher):
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, RelaunchConfirm), why="t offers a relaunch")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("relaunch failed" in n for n in _notes(app)), why="the failure said")
        assert any("exited with status 1" in n for n in _notes(app))
        # The event log shows the session's events on its next refresh, after the note.
        await wait_for(pilot, lambda: "relaunch with topk=2" in app.main.query_one("#events").plain(),
                       why="the relaunch in the event log")
    _run(sglang, check, fail="relaunch with topk=2 failed and was rolled back: the server exited with status 1")


def test_a_setting_the_launch_refuses_is_said_without_asking(sglang):
    async def check(app, pilot, session, relauncher):
        await pilot.press("t")
        await wait_for(pilot, lambda: any("exceeds the tree" in n for n in _notes(app)), why="the refusal said")
        assert not isinstance(app.screen, RelaunchConfirm) and relauncher.relaunched == []
    _run(sglang, check, refuse="num_draft_tokens=40 exceeds the tree")


def test_outside_managed_mode_the_reason_stays(sglang):
    async def check(app, pilot, session, relauncher):
        assert TOPK not in app.control_state().relaunch
        await pilot.press("t")
        await wait_for(pilot, lambda: any("cannot change topk live" in n for n in _notes(app)),
                       why="the needs-a-relaunch reason")
        assert not isinstance(app.screen, RelaunchConfirm) and sglang.posts == []
    _run(sglang, check, managed=False)


def test_a_live_knob_is_set_live_even_in_managed_mode():
    s = core_standin.StandIn(kind="refengine").start()
    try:
        async def check(app, pilot, session, relauncher):
            assert TOPK not in app.control_state().relaunch
            await pilot.press("t")
            await wait_for(pilot, lambda: any(p.get("server_args", {}).get(TOPK) == 2 for p in s.posts),
                           why="t set topk live")
            assert relauncher.proposed == []
        _run(s, check)
    finally:
        s.stop()
