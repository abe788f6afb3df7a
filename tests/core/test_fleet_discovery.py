"""Naming a fleet: command-line URLs, a `--fleet` TOML file, sglang-router's `GET /workers` (the
recorded answer of the real 0.3.2 binary, and routers that are down, slow or lying over real
sockets), and the rows' pure logic (age, aggregate, sort). Each bad input is one line."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from core_standin import StandIn
from harness import free_port
from tuner.fleet.discover import DiscoveryError, discover, member_of_arg
from tuner.fleet.fleet_file import FleetFileError, load_fleet_file
from tuner.fleet.router import RouterError, parse_workers, router_members
from tuner.fleet.rows import FleetRow, aged, aggregate, format_table, sort_rows

RECORDED = Path(__file__).resolve().parents[1] / "fleet" / "fixtures" / "router_workers.json"


def test_urls_and_names_on_the_command_line():
    assert member_of_arg("http://10.0.0.1:30000/").name == "10.0.0.1:30000"
    m = member_of_arg("east=http://10.0.0.1:30000")
    assert (m.name, m.url) == ("east", "http://10.0.0.1:30000")
    with pytest.raises(DiscoveryError, match="server 'x': not an http"):
        member_of_arg("x=ftp://host")
    with pytest.raises(DiscoveryError, match="used twice"):
        discover(["a=http://h:1", "a=http://h:2"])
    with pytest.raises(DiscoveryError, match="no server named"):
        discover([])


def test_fleet_file(tmp_path):
    f = tmp_path / "fleet.toml"
    f.write_text('[servers.a]\nurl = "http://127.0.0.1:30000"\napi_key_file = "a.key"\n'
                 '[servers.b]\nurl = "http://127.0.0.1:30001/"\n')
    a, b = load_fleet_file(f)
    assert (a.name, a.url, a.api_key_file, a.source) == ("a", "http://127.0.0.1:30000", tmp_path / "a.key", "fleet-file")
    assert (b.name, b.url, b.api_key_file) == ("b", "http://127.0.0.1:30001", None)
    # the same name on the command line and in the file
    with pytest.raises(DiscoveryError, match="'a' is used twice"):
        discover(["a=http://127.0.0.1:1"], str(f))


@pytest.mark.parametrize("text, says", [
    ("[servers.a\n", "not TOML"),
    ("title = 1\n", "no [servers.NAME] tables"),
    ("[servers.a]\nport = 1\n", "unknown key 'port'"),
    ("[servers.a]\napi_key_file = 'k'\n", "[servers.a]: no url"),
    ('[servers.a]\nurl = "http://user:hunter2@h:1/metrics"\n', "no path or query"),
])
def test_fleet_file_errors_are_one_line(tmp_path, text, says):
    f = tmp_path / "fleet.toml"
    f.write_text(text)
    with pytest.raises(FleetFileError) as e:
        load_fleet_file(f)
    assert says in str(e.value) and "\n" not in str(e.value) and "hunter2" not in str(e.value)


def test_fleet_file_that_is_not_a_file(tmp_path):
    with pytest.raises(FleetFileError, match="a directory, not a fleet file"):
        load_fleet_file(tmp_path)


def test_recorded_router_answer():
    members = parse_workers(json.loads(RECORDED.read_text()))
    assert [m.name for m in members] == ["127.0.0.1:42935", "127.0.0.1:33435"]
    assert members[0].labels["is_healthy"] == "True" and members[1].labels["is_healthy"] == "False"
    assert {m.source for m in members} == {"router"} and members[0].labels["model_id"] == "refengine-tiny"


@pytest.mark.parametrize("body, says", [
    ({"detail": "Not Found"}, 'no "workers" list'),
    ({"workers": ["http://h:1"]}, "worker 0 of GET /workers is not an object"),
    ({"workers": [{"url": "grpc://h:1"}]}, "worker 0 of GET /workers: not an http"),
    ({"workers": [{"url": "http://h:1"}, {"url": "http://h:1/"}]}, "used twice"),
])
def test_a_lying_router(body, says):
    with pytest.raises(RouterError, match=None) as e:
        parse_workers(body)
    assert says in str(e.value)


def test_router_down_slow_or_not_a_router():
    with pytest.raises(RouterError, match="is down"):
        router_members(f"http://127.0.0.1:{free_port()}")
    # Slow: a socket that takes connections and never answers; the read ends at its deadline.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        with pytest.raises(RouterError, match="too slow"):
            router_members(f"http://127.0.0.1:{hung.getsockname()[1]}", timeout=0.3, deadline=0.5)
    s = StandIn().start()       # a server, not a router: /workers is a 404
    try:
        with pytest.raises(RouterError, match="not sglang-router 0.3.x"):
            router_members(s.url)
    finally:
        s.stop()


def _row(name, state="connected", tok=None, tau=None, seen=100.0, errors=0):
    return FleetRow(name, f"http://{name}", state, tok_s=tok, tau=tau, last_seen=seen, http_errors=errors)


def test_rows_age_aggregate_and_sort():
    fresh, silent = aged(_row("a", seen=100.0), 100.5), aged(_row("b", seen=100.0), 101.6)
    assert fresh.state == "connected" and fresh.age_s == pytest.approx(0.5)
    assert silent.state == "degraded" and silent.detail == "no answer for 1.6 s"
    assert aged(_row("c", "gone", seen=90.0), 101.0).state == "gone"
    rows = [_row("a", tok=100.0, tau=2.0), _row("b", tok=300.0, tau=4.0, errors=2), _row("c", "gone")]
    agg = aggregate(rows)
    assert agg["tok_s"] == 400.0 and agg["tau"] == pytest.approx(3.5) and agg["http_errors"] == 2
    assert agg["states"] == {"connected": 2, "gone": 1}
    assert [r.name for r in sort_rows(rows, "tok_s", reverse=True)] == ["b", "a", "c"]   # unknown last
    assert [r.name for r in sort_rows(rows, "state")] == ["c", "a", "b"]
    lines = format_table(rows, agg).splitlines()
    assert len(lines) == 5 and lines[-1].startswith("all 3") and "1 gone, 2 connected" in lines[-1]
