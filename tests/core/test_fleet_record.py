"""`record --out FILE` over a fleet (two stand-in servers over real sockets): one file, schema 2, a
server column in every table, each member's records and header under its name; a member is read on
its own, a name it does not have is one line; `report` gives the fleet summary and one section per
server (Markdown and JSON)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from core_standin import StandIn
from tuner.cli import main
from tuner.recording import RecordingError, open_recording


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    servers = [StandIn().start(), StandIn().start()]
    out = tmp_path_factory.mktemp("fleet") / "fleet.db"
    try:
        rc = main(["record", f"a={servers[0].url}", f"b={servers[1].url}", "--out", str(out), "--duration", "1.5",
                   "--nvml-hz", "0"])
    finally:
        for s in servers:
            s.stop()
    assert rc == 0
    return out, [s.url for s in servers]


def test_one_file_with_a_server_column(recorded):
    out, urls = recorded
    db = sqlite3.connect(f"file:{out}?mode=ro&immutable=1", uri=True)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
        for table in ("samples", "events", "traces"):
            assert "server" in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        by_server = dict(db.execute("SELECT server, count(*) FROM samples GROUP BY server").fetchall())
        events_a = db.execute("SELECT count(*) FROM events WHERE server = 'a'").fetchone()[0]
    finally:
        db.close()
    assert set(by_server) == {"a", "b"} and min(by_server.values()) > 0 and events_a > 0

    with open_recording(out) as r:
        assert r.servers() == ["a", "b"] and r.header["fleet"] == [{"name": "a", "url": urls[0]},
                                                                     {"name": "b", "url": urls[1]}]
    with open_recording(out, server="a") as r:
        assert r.header["server"] == "a" and r.header["url"] == urls[0] and r.header["backend"] == "refengine"
        assert r.problem is None
        n_samples = sum(1 for _ in r.records(kinds=("samples",)))
        assert n_samples == by_server["a"] and len(r.events()) == events_a
    with pytest.raises(RecordingError, match=r"has no server 'zz' \(servers: a, b\)"):
        open_recording(out, server="zz")


def test_report_of_a_fleet_recording(recorded, capsys):
    out, _ = recorded
    assert main(["report", str(out), "--out", "-"]) == 0
    text = capsys.readouterr().out
    assert "## Fleet summary" in text and "## Server a" in text and "## Server b" in text
    summary = text.split("## Server a")[0]
    assert [line.split("|")[1].strip() for line in summary.splitlines() if line.startswith("| ")][1:] == ["a", "b"]
    assert main(["report", str(out), "--out", "-", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["server"] for r in doc["fleet"]["servers"]] == ["a", "b"] and set(doc["servers"]) == {"a", "b"}
    assert doc["servers"]["a"]["server"]["backend"] == "refengine"
    html_out = out.parent / "fleet.html"
    assert main(["report", str(out), "--out", str(html_out), "--overwrite"]) == 0
    page = html_out.read_text()
    assert page.count("<h2>Fleet summary</h2>") == 1 and 'id="server-a"' in page and 'id="server-b"' in page
    assert page.rstrip().endswith("</html>") and page.count("<body>") == 1
    assert main(["report", str(out), "--csv", str(out.parent / "csv")]) == 2
    assert "records a fleet of 2 servers" in capsys.readouterr().err


def test_replay_of_a_fleet_recording_opens_the_fleet_screen(recorded):
    import asyncio

    from harness import wait_until
    from tuner.commands.replay import open_fleet_replay
    from tuner.screens.fleet import FleetApp

    out, urls = recorded
    poller = open_fleet_replay(out)
    assert [m.name for m in poller.members] == ["a", "b"] and [m.url for m in poller.members] == urls

    async def scenario():
        app = FleetApp(poller)
        async with app.run_test(size=(140, 20)) as pilot:
            table = app.screen.query_one("#fleet-table")
            wait_until(lambda: {r.name: r.state for r in poller.rows()} == {"a": "connected", "b": "connected"},
                       20, "both members replaying")
            app.screen.refresh_rows()
            await pilot.pause()
            assert [str(table.get_row_at(i)[1]) for i in range(2)] == ["a", "b"]
            assert all(r.setting.get("speculative_num_steps") == 3 for r in poller.rows())

    async def member_view(session):
        from tuner.app import make_app

        app = make_app(session)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            assert "+0:0" in str(app.main.query_one("#header").render())     # a replay's position
            await pilot.press("q")

    with poller:
        asyncio.run(scenario())
        # enter: the member's replay in the usual view, handed from the poller's thread to the UI's
        asyncio.run(member_view(poller.session("a")))
        poller.give_back("a", closed=True)
        wait_until(lambda: poller.session("a") is not None, 20, "a replaying again under the fleet")
        poller.give_back("a")
    assert open_fleet_replay(Path(__file__).parents[1] / "report" / "fixtures" / "cpu-engine.db") is None


def test_what_a_fleet_recording_does_not_take_is_one_line(recorded, capsys, tmp_path):
    _, urls = recorded
    rc = main(["record", f"a={urls[0]}", f"b={urls[1]}", "--out", str(tmp_path / "x.db"), "--set-at",
               "1s:speculative_num_steps=2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "record one server" in err and not (tmp_path / "x.db").exists()


def test_a_member_that_answers_late_gets_the_load_too(tmp_path):
    """b is down when the fleet's load starts; once it answers (the poller asks again every 2 s) the
    recorder starts the same load on it, says so, and b's part of the file has its load_started."""
    import subprocess
    import sys

    from harness import ROOT

    a = StandIn().start()
    b = StandIn().start()
    port = b.port
    b.stop()                     # the port b will come back on: nothing answers there at the start
    out = tmp_path / "late.db"
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "record", f"a={a.url}", f"b=http://127.0.0.1:{port}",
                             "--out", str(out), "--duration", "5", "--load", "1", "--max-new-tokens", "4",
                             "--nvml-hz", "0"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:            # the load has started on what answered: then b comes up
            lines.append(line)
            if "recording 2 servers" in line:
                b.start(port)
                break
        lines += proc.stderr.readlines()
        assert proc.wait(60) == 0, "".join(lines)
    finally:
        proc.kill()
        a.stop()
        b.stop()
    assert any("b answered: its load of 1 starts now" in line for line in lines), "".join(lines)
    with open_recording(out, server="b") as r:
        assert [e.kind for e in r.events() if e.kind == "load_started"] == ["load_started"]
    with open_recording(out, server="a") as r:
        assert [e.kind for e in r.events() if e.kind == "load_started"] == ["load_started"]
