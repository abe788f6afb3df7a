"""sglang-router 0.3.2 for real (the `fleet` extra's wheel, its Rust binary) in front of four
`serve --tp-size 1` on loopback: requests go through it round-robin, the fleet is discovered from its
`GET /workers` (same shape as the recorded fixture), `once --router` gives one row per worker, and a
worker killed behind it is gone in its row. A second router over two recording stand-ins checks what
registering a worker asks of it, and that `serve`-shaped workers report no load to power_of_two.

COST: the heaviest module of the suite per second: four engines (4 + 4 processes) and two routers on
2 cores, about 30 s. One module, one set of servers (module scope).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness import ROOT, free_port, start_server, wait_until

pytest.importorskip("sglang_router", reason="the fleet extra (sglang-router) is not installed: make test installs it")
pytestmark = pytest.mark.slow

SERVE = ["--tp-size", "1", "--port", "0", "--max-running-requests", "2"]
N = 4
RECORDED = Path(__file__).parent / "fixtures" / "router_workers.json"


def start_router(workers: list[str], policy: str = "round_robin") -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = Path(ROOT / ".pytest_cache").joinpath(f"router-{port}.log")
    log.parent.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
         "--worker-urls", *workers, "--policy", policy, "--health-check-interval-secs", "1",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn"],
        stdout=log.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}", log


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)


def workers(router: str) -> dict:
    try:
        r = httpx.get(router + "/workers", timeout=5)
        return r.json() if r.status_code == 200 else {}
    except httpx.HTTPError:
        return {}


@pytest.fixture(scope="module")
def fleet():
    # One after another from this thread: a server dies with the thread that started it
    # (PR_SET_PDEATHSIG), and on 2 cores starting them at once gains nothing.
    servers: list = []
    router = None
    try:
        for _ in range(N):
            servers.append(start_server(SERVE))
        router, url, log = start_router([s.url for s in servers])
        wait_until(lambda: (w := workers(url)) and w.get("total") == N
                   and all(x.get("is_healthy") for x in w["workers"]), 90, "4 healthy workers behind the router")
        yield servers, url, log
    finally:
        if router is not None:
            stop(router)
        for s in servers:
            s.stop()


def served_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sglang:num_requests_total"))


def test_router_in_front_of_serve(fleet, capsys):
    from tuner.cli import main
    from tuner.fleet.router import parse_workers, router_members

    servers, router, _ = fleet
    answer = workers(router)
    recorded = json.loads(RECORDED.read_text())
    # the live answer has every field the recorded one has (the recorded fixture is still true)
    assert set(recorded) <= set(answer) and set(recorded["workers"][0]) <= set(answer["workers"][0])
    members = router_members(router)
    assert sorted(m.url for m in members) == sorted(s.url for s in servers)
    assert parse_workers(answer) == members and all(m.labels["is_healthy"] == "True" for m in members)

    before = [served_requests(s.url) for s in servers]
    for i in range(2 * N):
        r = httpx.post(router + "/generate", json={"text": f"def f{i}(", "sampling_params": {"max_new_tokens": 4}},
                       timeout=120)
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 4
    after = [served_requests(s.url) for s in servers]
    assert [b - a for a, b in zip(before, after)] == [2] * N          # round robin: two each

    assert main(["once", "--router", router, "--seconds", "0.5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["servers"]
    assert len(rows) == N and {r["state"] for r in rows} == {"connected"} and {r["kind"] for r in rows} == {"refengine"}

    # a worker killed behind the router: gone in its row, the router marks it unhealthy
    servers[-1].kill()
    dead = servers[-1].url
    wait_until(lambda: any(w["url"] == dead and not w["is_healthy"] for w in workers(router).get("workers", [])),
               30, "the router to mark the killed worker unhealthy")
    assert main(["once", "--router", router, "--seconds", "0.3", "--json"]) == 1
    rows = {r["url"]: r for r in json.loads(capsys.readouterr().out)["servers"]}
    assert rows[dead]["state"] == "gone" and "cannot connect" in rows[dead]["detail"]
    assert sum(r["state"] == "connected" for r in rows.values()) == N - 1


def test_what_registering_asks_and_power_of_two_loads():
    """Registration asks /health, /model_info and /server_info (sglang-router 0.3.2); power_of_two
    gets no load from a server shaped like SGLang 0.5.23 (no /get_load): /get_loads says -1."""
    sys.path.insert(0, str(ROOT / "tests" / "core"))
    from core_standin import StandIn

    asked: list[str] = []

    def recording(standin):
        base = standin._httpd.RequestHandlerClass

        class Recording(base):
            def do_GET(self):
                asked.append(self.path)
                if self.path == "/health":
                    return self._send(200, "")
                if self.path == "/model_info":
                    return self._send(200, {"model_path": "tiny", "is_generation": True})
                return super().do_GET()

        standin._httpd.RequestHandlerClass = Recording
        return standin

    stand = [recording(StandIn().start()), recording(StandIn().start())]
    router, url, _ = start_router([s.url for s in stand], policy="power_of_two")
    try:
        wait_until(lambda: workers(url).get("total") == 2, 60, "two workers registered")
        assert {"/health", "/model_info", "/server_info"} <= set(asked)
        loads = httpx.get(url + "/get_loads", timeout=10).json()["workers"]
        assert sorted(x["worker"] for x in loads) == sorted(s.url for s in stand)
        assert {x["load"] for x in loads} == {-1}
    finally:
        stop(router)
        for s in stand:
            s.stop()
