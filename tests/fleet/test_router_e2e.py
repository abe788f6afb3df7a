"""sglang-router 0.3.2 for real (the `fleet` extra's wheel, its Rust binary) in front of four
`serve --tp-size 1` on loopback: requests go through it round-robin, the fleet is discovered from its
`GET /workers` (same shape as the recorded fixture), `once --router` gives one row per worker, and a
worker killed behind it is gone in its row. A second router over two recording stand-ins checks what
registering a worker asks of it, and that `serve`-shaped workers report no load to power_of_two.

COST: four engines and two routers on 2 cores. One module, one set of servers (module scope): the
four engines are launched together and waited for together, and the stand-ins' router registers
its workers while they boot; the router marks a worker unhealthy after one failed check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness import ROOT, free_port, start_servers, wait_until

pytest.importorskip("sglang_router", reason="the fleet extra (sglang-router) is not installed: make test installs it")
pytestmark = pytest.mark.slow

# No server warmup: the eight requests below are the first each worker serves, and nothing here
# measures speed (the warmup is most of a CPU engine's start).
SERVE = ["--tp-size", "1", "--port", "0", "--max-running-requests", "2", "--skip-server-warmup"]
N = 4
RECORDED = Path(__file__).parent / "fixtures" / "router_workers.json"


def start_router(workers: list[str], policy: str = "round_robin") -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = Path(ROOT / ".pytest_cache").joinpath(f"router-{port}.log")
    log.parent.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
         "--worker-urls", *workers, "--policy", policy, "--health-check-interval-secs", "1",
         # one failed check marks a worker unhealthy (3 by default), and nothing is in flight at the end
         "--health-failure-threshold", "1", "--shutdown-grace-period-secs", "1",
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


def recording_standin(asked: list[str]):
    """A stand-in server that records every GET path and answers registration's /health and
    /model_info as SGLang 0.5.23 does (and no /get_load, as SGLang has none)."""
    sys.path.insert(0, str(ROOT / "tests" / "core"))
    from core_standin import StandIn

    standin = StandIn().start()
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


@pytest.fixture(scope="module")
def fleet():
    """Four ready `serve` behind a round_robin router, and a power_of_two router over two recording
    stand-ins (with what they were asked). Everything is started from this thread: a server dies
    with the thread that started it (PR_SET_PDEATHSIG)."""
    servers: list = []
    routers: list = []
    stand: list = []
    asked: list[str] = []
    try:
        # The stand-ins' router registers its workers while the engines boot.
        stand = [recording_standin(asked), recording_standin(asked)]
        routers.append(start_router([s.url for s in stand], policy="power_of_two"))
        servers = start_servers(N, SERVE)
        routers.append(start_router([s.url for s in servers]))
        url = routers[-1][1]
        wait_until(lambda: (w := workers(url)) and w.get("total") == N
                   and all(x.get("is_healthy") for x in w["workers"]), 90, "4 healthy workers behind the router")
        yield servers, url, routers[0][1], stand, asked
    finally:
        for proc, _, _ in routers:
            proc.terminate()
        # side by side: each waits for its own graceful exit
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda x: stop(x[0]), routers))
            list(pool.map(lambda s: s.stop(), [*servers, *stand]))


def served_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sglang:num_requests_total"))


def test_router_in_front_of_serve(fleet, capsys):
    from tuner.cli import main
    from tuner.fleet.router import parse_workers, router_members

    servers, router, _, _, _ = fleet
    answer = workers(router)
    recorded = json.loads(RECORDED.read_text())
    # the live answer has every field the recorded one has (the recorded fixture is still true)
    assert set(recorded) <= set(answer) and set(recorded["workers"][0]) <= set(answer["workers"][0])
    members = router_members(router)
    assert sorted(m.url for m in members) == sorted(s.url for s in servers)
    assert parse_workers(answer) == members and all(m.labels["is_healthy"] == "True" for m in members)

    before = [served_requests(s.url) for s in servers]

    def generate(i: int) -> httpx.Response:
        return httpx.post(router + "/generate", json={"text": f"def f{i}(", "sampling_params": {"max_new_tokens": 4}},
                          timeout=120)

    # all at once: round robin deals them out in arrival order, and each worker batches its two
    with ThreadPoolExecutor(2 * N) as pool:
        for r in pool.map(generate, range(2 * N)):
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


def test_what_registering_asks_and_power_of_two_loads(fleet):
    """Registration asks /health, /model_info and /server_info (sglang-router 0.3.2); power_of_two
    gets no load from a server shaped like SGLang 0.5.23 (no /get_load): /get_loads says -1."""
    _, _, url, stand, asked = fleet
    wait_until(lambda: workers(url).get("total") == 2, 60, "two workers registered")
    assert {"/health", "/model_info", "/server_info"} <= set(asked)
    loads = httpx.get(url + "/get_loads", timeout=10).json()["workers"]
    assert sorted(x["worker"] for x in loads) == sorted(s.url for s in stand)
    assert {x["load"] for x in loads} == {-1}
