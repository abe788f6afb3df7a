"""The fleet screen over a real FleetPoller and two stand-in servers (real sockets) plus one that is
not there: a row per server and the aggregate row, the sort key, a steps change to the selection
after the confirmation with each server's outcome, and enter handing the server to the app."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

from harness import free_port
from probes.names import STEPS
from tuner.fleet.members import Member
from tuner.fleet.poller import FleetPoller
from tuner.screens.fleet import FleetApp, FleetConfirm, FleetScreen

from .helpers import screen_lines, wait_for

_spec = importlib.util.spec_from_file_location(
    "core_standin", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)


def test_fleet_screen_rows_sort_change_and_enter():
    a, b = core_standin.StandIn().start(), core_standin.StandIn().start()
    b.refuse_next = "speculative_num_steps must be <= 3"
    members = [Member("b", b.url), Member("a", a.url), Member("dead", f"http://127.0.0.1:{free_port()}")]

    async def scenario(poller):
        app = FleetApp(poller)
        async with app.run_test(size=(160, 30)) as pilot:
            screen = await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen, why="screen")
            await wait_for(pilot, lambda: any("all 3" in line and "1 gone, 2 connected" in line
                                              for line in screen_lines(app)), why="the rows and the aggregate")
            assert screen.order == ["a", "b", "dead"]
            await pilot.press("o")                        # sort by state: the worst first
            await wait_for(pilot, lambda: screen.order[0] == "dead", why="sorted by state")
            assert screen.sort_key == "state"
            # The cursor is on dead: its reason, cut in the state column, is whole under the table.
            dead = next(r for r in poller.rows() if r.name == "dead")
            assert len(dead.state_text) > 60
            await wait_for(pilot, lambda: f"dead: {dead.state_text}" in str(
                screen.query_one("#fleet-outcome").render()), why="dead's whole reason")
            screen.sort_key = "name"
            screen.refresh_rows()
            await pilot.press("a")                        # select all, then steps +1 on the selection
            await pilot.press("plus")
            await wait_for(pilot, lambda: isinstance(app.screen, FleetConfirm), why="the confirmation")
            assert "a: steps 3 → 4" in app.screen.question and "b: steps 3 → 4" in app.screen.question
            await pilot.press("y")
            await wait_for(pilot, lambda: "a: applied" in screen.outcome, why="the outcomes")
            assert "b: refused (speculative_num_steps must be <= 3)" in screen.outcome
            assert a.config["steps"] == 4 and b.config["steps"] == 3
            await pilot.press("down")                     # cursor on b, then enter opens it
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.return_value == "b", why="enter hands b to the app")

    try:
        with FleetPoller(members) as poller:
            asyncio.run(scenario(poller))
    finally:
        a.stop()
        b.stop()
