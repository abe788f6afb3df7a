"""`--router` on the fleet screen over real sockets: a router stand-in whose `GET /workers` answer
the test sets, and stand-in servers. The screen opens while the router is down (its one line in the
status line), a router that comes up adds its workers (one that is not a server is refused in its
row), a worker whose name is taken is left out with one line, an answer that is not sglang-router's
is one line. A server that hangs or dies is degraded or gone within 2 s of the fleet's clock."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from harness import free_port, wait_until
from tuner.core.clock import ManualClock
from tuner.fleet.members import Member
from tuner.fleet.overlays import Refreshing
from tuner.fleet.poller import FleetPoller
from tuner.fleet.router_watch import RouterWatch
from tuner.screens.fleet import FleetApp, FleetScreen

from .helpers import wait_for

_spec = importlib.util.spec_from_file_location(
    "core_standin", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)
StandIn = core_standin.StandIn


class RouterStandIn:
    """GET /workers answers `self.answer` (JSON); nothing else is served."""

    def __init__(self, port: int) -> None:
        self.answer: object = {"workers": []}
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                data = json.dumps(me.answer).encode()
                self.send_response(200 if self.path == "/workers" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def status(screen: FleetScreen) -> str:
    return str(screen.query_one("#fleet-outcome").render())


def test_router_down_then_up_lying_and_duplicate_names_on_the_screen():
    a, b, c = StandIn().start(), StandIn().start(), StandIn().start()
    web = StandIn().start()
    web.mode = "html"                        # a web server the router lists as a worker
    port = free_port()
    router_url = f"http://127.0.0.1:{port}"
    # on the command line: a member named as the router will name c, at another URL
    taken = Member(f"127.0.0.1:{c.port}", a.url)
    watch = RouterWatch(router_url)
    poller = FleetPoller([taken], overlays=[Refreshing(watch, 0.2)])
    watch.poller = poller
    router = None

    async def scenario():
        nonlocal router
        app = FleetApp(poller)
        async with app.run_test(size=(160, 30)) as pilot:
            screen = await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen, why="screen")
            # down: the screen is open, the router's problem one line in the status line
            await wait_for(pilot, lambda: f"router {router_url} is down" in status(screen), why="router down")
            router = RouterStandIn(port)
            router.answer = {"workers": [{"url": b.url, "is_healthy": True}, {"url": web.url, "is_healthy": True},
                                         {"url": c.url, "is_healthy": True}]}
            await wait_for(pilot, lambda: {r.name: r.state for r in poller.rows()}.get(f"127.0.0.1:{b.port}")
                           == "connected" and {r.name: r.state for r in poller.rows()}.get(f"127.0.0.1:{web.port}")
                           == "refused", why="the router's workers in rows")
            await wait_for(pilot, lambda: f"router worker {c.url} left out: fleet: server name '127.0.0.1:{c.port}' "
                           "is used twice" in status(screen), why="the duplicate name")
            assert "is down" not in status(screen)
            assert len(poller.rows()) == 3          # the taken name, b and the web server; c left out
            router.answer = {"servers": []}
            await wait_for(pilot, lambda: "is not sglang-router 0.3.x" in status(screen)
                           or "is not sglang-router's answer" in status(screen), why="a lying router")
            line = [x for x in status(screen).splitlines() if "router" in x and "answer" in x]
            assert len(line) == 1, status(screen)
            await pilot.press("q")

    try:
        with poller:
            asyncio.run(scenario())
    finally:
        for s in (a, b, c, web):
            s.stop()
        if router is not None:
            router.stop()


def test_a_server_that_hangs_or_dies_is_degraded_or_gone_within_2_s():
    hangs, dies = StandIn().start(), StandIn().start()
    clock = ManualClock(1000.0)
    with FleetPoller([Member("hangs", hangs.url), Member("dies", dies.url)], clock=clock) as poller:
        wait_until(lambda: all(r.state == "connected" and r.last_seen == clock.now() for r in poller.rows()),
                   30, "both connected and seen at the fleet's now")
        hangs._httpd.shutdown()             # nobody serves its socket any more: connections hang
        dies.stop()                         # its port refuses connections

        def published() -> dict:
            return {n: s.row for n, s in poller._slots.items()}

        # each member's thread publishes twice more (on the frozen clock), so what the servers
        # answered before they stopped is in the rows already
        before, seen = published(), {"hangs": 0, "dies": 0}

        def twice() -> bool:
            nonlocal before
            now = published()
            for n in seen:
                seen[n] += now[n] is not before[n]
            before = now
            return min(seen.values()) >= 2
        wait_until(twice, 30, "two publications of each row after the stop")
        # whatever each server's thread is doing now (waiting on a read, retrying), 2 s later on the
        # fleet's clock neither row may still say connected
        clock.advance(2.0)
        rows = {r.name: r for r in poller.rows()}
        assert rows["hangs"].state == "degraded" and "no answer for 2.0 s" in rows["hangs"].detail
        assert rows["dies"].state in ("degraded", "gone")
        wait_until(lambda: {r.name: r for r in poller.rows()}["dies"].state == "gone", 10, "dies gone")
    hangs._httpd.server_close()
