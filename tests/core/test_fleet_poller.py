"""The fleet over real sockets: two stand-in servers, one that hangs (takes connections, never
answers), one of another kind (answers HTML), one that is not there. Each row says its own state
and the others stay fresh; `once` and `doctor` give one row or verdict per server.

One set of servers for the module (stopping a stand-in waits on its serve loop's poll): the one that
dies is its own, and a test that changes a setting puts it back."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from core_standin import StandIn
from harness import free_port, wait_until
from tuner.cli import main
from tuner.fleet.change import apply_to_fleet
from tuner.fleet.members import Member
from tuner.fleet.poller import FleetPoller


@pytest.fixture(scope="module")
def fleet():
    good = [StandIn().start(), StandIn().start(), StandIn().start()]     # the third one dies
    other = StandIn().start()
    other.mode = "html"                      # a web server, not a model server
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)                          # the kernel completes the handshake; nobody ever reads
    urls = {"a": good[0].url, "b": good[1].url, "c": good[2].url, "web": other.url,
            "hung": f"http://127.0.0.1:{hung.getsockname()[1]}", "dead": f"http://127.0.0.1:{free_port()}"}
    yield good, urls
    hung.close()
    # side by side: each stop waits up to half a second for its serve loop to notice
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda s: s.stop(), (*good, other)))


def by_name(rows):
    return {r.name: r for r in rows}


def test_each_server_its_own_state_and_none_stalls_the_others(fleet):
    good, urls = fleet
    with FleetPoller([Member(n, u) for n, u in urls.items()]) as poller:
        def settled():
            rows = by_name(poller.rows())
            return (rows["a"].state == rows["b"].state == rows["c"].state == "connected"
                    and rows["dead"].state == "gone"
                    and rows["web"].state == "refused" and rows["hung"].state == "degraded") and rows
        rows = wait_until(settled, 30, "every server's state")
        assert "no answer for" in rows["hung"].detail and "not SGLang" not in rows["dead"].detail
        assert "cannot connect" in rows["dead"].detail and "/server_info" in rows["web"].detail
        assert rows["a"].setting["speculative_num_steps"] == 3 and rows["a"].kind == "refengine"
        # the hung server is still hanging (its connect waits on its deadline), yet the good ones
        # keep answering: their rows are fresh
        seen = rows["a"].last_seen
        fresh = wait_until(lambda: (r := by_name(poller.rows()))["a"].last_seen > seen and r, 10, "a newer row of a")
        assert fresh["a"].age_s < 1.5 and fresh["hung"].state == "degraded"
        # a server that dies is gone in its row
        good[2].stop()
        wait_until(lambda: by_name(poller.rows())["c"].state == "gone", 10, "c gone")
        assert by_name(poller.rows())["a"].state == "connected"


def test_a_change_to_several_servers_says_each_outcome(fleet):
    good, urls = fleet
    good[1].refuse_next = "speculative_num_steps must be <= 2"
    with FleetPoller([Member("a", urls["a"]), Member("b", urls["b"])]) as poller:
        wait_until(lambda: len(poller.sessions()) == 2, 30, "both connected")
        out = apply_to_fleet(poller.sessions(), {"speculative_num_steps": 2})
    try:
        assert out["a"].status == "applied" and good[0].config["steps"] == 2
        assert out["b"].status == "refused" and "must be <= 2" in out["b"].reason
    finally:
        good[0].config.update(steps=3, num_draft_tokens=4)


def test_once_over_a_fleet(fleet, capsys):
    good, urls = fleet
    rc = main(["once", f"a={urls['a']}", f"b={urls['b']}", f"dead={urls['dead']}", "--seconds", "0.5", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 1                                       # one server is gone
    rows = {s["name"]: s for s in r["servers"]}
    assert rows["a"]["state"] == "connected" and rows["dead"]["state"] == "gone"
    assert r["aggregate"]["servers"] == 3 and r["aggregate"]["states"]["connected"] == 2
    assert main(["once", f"a={urls['a']}", f"b={urls['b']}", "--seconds", "0.3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[1].startswith("a ") and lines[3].startswith("all 2")


def test_once_and_doctor_bad_fleets_one_line(fleet, capsys, tmp_path):
    _, urls = fleet
    assert main(["once", f"a={urls['a']}", f"a={urls['b']}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"specdecode-tune once: fleet: server name 'a' is used twice ({urls['a']} and {urls['b']})"
    assert main(["doctor", "--router", urls["dead"]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is down" in err
    bad = tmp_path / "f.toml"
    bad.write_text("[servers.x]\nurl = 'nope'\n")
    assert main(["once", "--fleet", str(bad)]) == 2
    assert "not an http(s) URL" in capsys.readouterr().err


def test_doctor_one_verdict_per_server(fleet, capsys):
    _, urls = fleet
    rc = main(["doctor", f"a={urls['a']}", f"web={urls['web']}", f"dead={urls['dead']}", "--wait-s", "0.3"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 2 and len(lines) == 3
    assert lines[0].startswith("a ") and "the reference engine" in lines[0]
    assert lines[1].startswith("web ") and "--  unreachable" in lines[1]
    assert lines[2].startswith("dead") and "cannot connect" in lines[2]
