"""Broken and hostile files around `report`, `record`, `replay` and `tune --json`: outputs that must
not be replaced, unwritable places, damaged and crashed recordings, server strings in Markdown.
Real SQLite files, the real commands; nothing is mocked."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest

from synthetic import write
from tuner.cli import main
from tuner.recording import Recorder, RecordingError, open_recording
from tuner.report import load

ENGINE_FIXTURE = Path(__file__).parent / "fixtures" / "cpu-engine.db"


@pytest.fixture
def rec(tmp_path) -> Path:
    p = tmp_path / "rec.db"
    shutil.copy(ENGINE_FIXTURE, p)
    return p


def run(capsys, *args: object) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:      # argparse errors
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


def one_line(err: str) -> bool:
    return err.count("\n") == 1 and "Traceback" not in err


# -- report outputs ----------------------------------------------------------------------------------

def test_report_refuses_an_existing_output_without_overwrite(rec, tmp_path, capsys):
    out = tmp_path / "r.html"
    out.write_text("keep me")
    rc, err = run(capsys, "report", rec, "--out", out)
    assert rc == 2 and one_line(err) and "exists" in err and "--overwrite" in err
    assert out.read_text() == "keep me"
    rc, err = run(capsys, "report", rec, "--out", out, "--overwrite")
    assert rc == 0 and out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("how", ["out", "perfetto", "hardlink", "symlink", "wal"])
def test_report_never_writes_over_its_own_input(rec, tmp_path, capsys, how):
    before = rec.read_bytes()
    if how == "out":
        args = ["--out", rec, "--format", "html"]
    elif how == "perfetto":
        args = ["--perfetto", rec]
    elif how == "hardlink":
        os.link(rec, tmp_path / "link.html")
        args = ["--out", tmp_path / "link.html"]
    elif how == "symlink":
        os.symlink(rec, tmp_path / "sym.md")
        args = ["--out", tmp_path / "sym.md"]
    else:
        args = ["--out", Path(str(rec) + "-wal"), "--format", "md"]
    rc, err = run(capsys, "report", rec, *args, "--overwrite")
    assert rc == 2 and one_line(err) and "refusing" in err
    assert rec.read_bytes() == before
    assert not Path(str(rec) + "-wal").exists()


def test_overwrite_replaces_only_regular_files(rec, tmp_path, capsys):
    d = tmp_path / "adir"
    d.mkdir()
    rc, err = run(capsys, "report", rec, "--out", d, "--format", "md", "--overwrite")
    assert rc == 2 and one_line(err) and "directory" in err
    rc, err = run(capsys, "report", rec, "--out", "/dev/full", "--format", "md", "--overwrite")
    assert rc == 2 and one_line(err) and "not a regular file" in err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    fifo = tmp_path / "fifo.md"
    os.mkfifo(fifo)
    rc, err = run(capsys, "report", rec, "--out", fifo, "--overwrite")
    assert rc == 2 and one_line(err) and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_unwritable_places_are_one_line_before_the_recording_is_read(rec, tmp_path, capsys):
    afile = tmp_path / "plain"
    afile.write_text("x")
    for args in (["--out", afile / "r.html"],                   # parent is a file
                 ["--out", "/proc/specdecode-report.md"],       # a place no one may create files in
                 ["--perfetto", "/proc/specdecode.json"],
                 ["--csv", afile],                              # --csv names a file
                 ["--csv", "/proc/specdecode-csv"]):
        rc, err = run(capsys, "report", rec, *args)
        assert rc == 2 and one_line(err), (args, err)


def test_csv_files_are_not_replaced_without_overwrite(rec, tmp_path, capsys):
    d = tmp_path / "csv"
    d.mkdir()
    (d / "events.csv").write_text("mine")
    rc, err = run(capsys, "report", rec, "--csv", d)
    assert rc == 2 and one_line(err) and "events.csv" in err
    assert (d / "events.csv").read_text() == "mine" and not (d / "samples.csv").exists()
    rc, err = run(capsys, "report", rec, "--csv", d, "--overwrite")
    assert rc == 0 and (d / "events.csv").read_text().startswith("t,t_rel_s,kind,data")


# -- record outputs --------------------------------------------------------------------------------

def test_record_overwrite_replaces_only_recordings_and_empty_files(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("not a recording")
    other_db = tmp_path / "other.db"
    con = sqlite3.connect(other_db)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    d = tmp_path / "dir.db"
    d.mkdir()
    for target, why in ((other, "not a specdecode-tune recording"), (other_db, "not a specdecode-tune recording"),
                        (d, "directory"), (Path("/dev/full"), "not a regular file")):
        # Refused before connecting: the URL points nowhere, and the error is about the file.
        rc, err = run(capsys, "record", "http://127.0.0.1:9", "--out", target, "--overwrite")
        assert rc == 2 and one_line(err) and why in err, (target, err)
        with pytest.raises(RecordingError, match=why):
            Recorder(target, overwrite=True)
    assert other.read_text() == "not a recording" and d.is_dir() and stat.S_ISCHR(os.stat("/dev/full").st_mode)
    empty = tmp_path / "empty.db"
    empty.touch()
    Recorder(empty, overwrite=True).close()
    old = write(tmp_path / "old.db")
    Recorder(old, {"backend": "x"}, overwrite=True).close()
    assert open_recording(old).header["backend"] == "x"


def test_tune_json_is_checked_before_connecting(tmp_path, capsys):
    rc, err = run(capsys, "tune", "http://127.0.0.1:9", "--json", "/proc/specdecode-tune.json")
    assert rc == 2 and one_line(err) and "--json" in err and "connect" not in err
    rc, err = run(capsys, "tune", "http://127.0.0.1:9", "--json", tmp_path)
    assert rc == 2 and one_line(err) and "directory" in err


def test_replay_refuses_a_speed_that_is_not_a_number(rec, capsys):
    for bad in ("nan", "inf", "-1", "0"):
        rc, err = run(capsys, "replay", rec, "--speed", bad)
        assert rc == 2 and one_line(err) and "--speed" in err
    rc, err = run(capsys, "replay", rec, "--start", "nan")
    assert rc == 2 and one_line(err) and "--start" in err


# -- damaged and crashed recordings -----------------------------------------------------------------

@pytest.mark.parametrize("percent", [5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99])
def test_a_cut_recording_is_one_line_and_what_is_readable(rec, tmp_path, capsys, percent):
    data = rec.read_bytes()
    cut = tmp_path / f"cut{percent}.db"
    cut.write_bytes(data[: len(data) * percent // 100])
    out = tmp_path / "cut.md"
    rc, err = run(capsys, "report", cut, "--out", out)
    assert "Traceback" not in err and err.strip(), err
    if rc == 0:
        assert out.exists() and "truncated" in err
    else:
        assert rc == 1 and one_line(err)
    try:
        r = open_recording(cut)
    except RecordingError:
        return
    with r:
        list(r.records())
        r.events()
        r.traces()
        r.seq_at(0.0)
        assert r.problem and "truncated" in r.problem


def test_readers_create_nothing_next_to_their_input(rec, tmp_path, capsys):
    before = sorted(p.name for p in tmp_path.iterdir())
    with open_recording(rec) as r:
        list(r.records())
    load(rec)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def crashed_copy(tmp_path: Path) -> Path:
    """A recording as a killed recorder leaves it: the file and its -wal, copied while it runs."""
    live = tmp_path / "live" / "rec.db"
    live.parent.mkdir()
    from tuner.core.records import Event, Sample
    r = Recorder(live, {"backend": "test"}, commit_every_s=3600)
    r.write([Sample(100.0 + i, "x", float(i)) for i in range(50)] + [Event(101.0, "note", {"text": "hi"})])
    r.flush()
    dest = tmp_path / "crashed"
    dest.mkdir()
    for suffix in ("", "-wal"):
        shutil.copy(str(live) + suffix, str(dest / "rec.db") + suffix)
    r.close()
    return dest / "rec.db"


def test_a_crashed_recording_is_recovered_in_a_private_copy(tmp_path, capsys):
    path = crashed_copy(tmp_path)
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    with open_recording(path) as r:
        assert r.recovered_copy and "private copy" in r.problem
        assert [s.value for s in r.records(kinds=("samples",))] == [float(i) for i in range(50)]
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before
    out = tmp_path / "r.md"
    rc, err = run(capsys, "report", path, "--out", out)
    assert rc == 0 and "private copy" in err and "private copy" in out.read_text()


def test_a_missing_or_unreadable_wal_is_named_with_what_was_read(tmp_path, capsys):
    path = crashed_copy(tmp_path)
    wal = Path(str(path) + "-wal")
    wal.unlink()
    # All the data was in the WAL: the file alone holds no recording, and the message says why.
    with pytest.raises(RecordingError, match="rec.db-wal is missing"):
        open_recording(path)
    rc, err = run(capsys, "report", path, "--out", tmp_path / "r.md")
    assert rc == 1 and one_line(err) and "rec.db-wal is missing" in err
    # The WAL is there but cannot be read (a directory in its place): named, the file read without it.
    wal.mkdir()
    with pytest.raises(RecordingError, match="rec.db-wal cannot be read"):
        open_recording(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["rec.db", "rec.db-wal"]


def test_a_crashed_recording_with_some_data_in_the_file_reads_that_and_names_the_wal(tmp_path):
    live = tmp_path / "rec.db"
    from tuner.core.records import Sample
    r = Recorder(live, {"backend": "test"}, commit_every_s=3600)
    r.write([Sample(100.0 + i, "x", float(i)) for i in range(20)])
    r.flush()
    # A checkpoint moves the first commits into the file (as SQLite does by itself every 1000 pages).
    con = sqlite3.connect(live)
    con.execute("PRAGMA wal_checkpoint(PASSIVE)")
    con.close()
    r.write([Sample(200.0 + i, "x", float(i)) for i in range(20)])
    r.flush()
    dest = tmp_path / "crashed.db"
    shutil.copy(live, dest)            # the -wal is lost
    r.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    with open_recording(dest) as rd:
        assert "crashed.db-wal is missing" in rd.problem
        assert [s.value for s in rd.records()] == [float(i) for i in range(20)]
    assert sorted(p.name for p in tmp_path.iterdir()) == before      # no -wal/-shm made beside it


def test_a_schema_version_that_is_not_a_number_is_one_line(tmp_path, capsys):
    p = write(tmp_path / "s.db")
    con = sqlite3.connect(p)
    con.execute("UPDATE meta SET value = '\"abc\"' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(RecordingError, match="schema_version"):
        open_recording(p)
    rc, err = run(capsys, "report", p, "--out", tmp_path / "s.md")
    assert rc == 1 and one_line(err) and "schema_version" in err


# -- server strings in the Markdown report ----------------------------------------------------------

def test_markdown_report_escapes_server_strings(tmp_path, capsys):
    from tuner.core.records import Event

    evil = '<script>alert(1)</script><img src=x onerror=alert(2)>'
    p = tmp_path / "evil.db"
    info = {"kind": "sglang", "version": evil, "model": evil, "tp_size": 2,
            "launch": {"model_path": evil, "x": "`code` | pipe"}, "active": {}}
    r = Recorder(p, {"backend": "sglang", "url": evil, "server_info": info, "launch": info["launch"],
                     "command": "specdecode-tune record ` <b>x</b>"})
    r.write([Event(1.0, "server_info", info), Event(2.0, "disconnected", {"error": evil}),
             Event(3.0, "connected", {"after_s": 1.0})])
    r.close()
    out = tmp_path / "evil.md"
    rc, err = run(capsys, "report", p, "--out", out)
    assert rc == 0, err
    text = out.read_text()
    assert "<script" not in text and "<img" not in text and "&lt;script&gt;" in text
    # The command line is inline code (where HTML is inert) with a fence longer than its backticks.
    assert [ln for ln in text.splitlines() if "<b>" in ln] == ["Recorded with ``specdecode-tune record ` <b>x</b>``."]
