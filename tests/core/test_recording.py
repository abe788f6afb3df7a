"""Recordings in real SQLite files: round trips, crash recovery, bad files, replay on a virtual clock."""

from __future__ import annotations

import gzip
import math
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness import read_only_query, wait_until
from tuner.core.clock import ManualClock
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample, Trace
from tuner.core.session import Session
from tuner.recording import Recorder, RecordingError, open_recording
from tuner.recording.replay import ReplayBackend
from tuner.recording.schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]


def some_records(n: int = 50, t0: float = 100.0) -> list:
    out = [Event(t0, EventKind.SERVER_INFO, {"kind": "refengine", "active": {"speculative_num_steps": 3},
                                             "launch": {"tp_size": 2}, "nested": [1, {"a": [2.5, None]}]})]
    for i in range(n):
        t = t0 + i * 0.25
        out.append(Sample(t, "server/tok_per_s", 100.0 + i))
        out.append(Sample(t, "spec/accept_pos/1", math.nan if i % 7 == 0 else 0.5))
        if i == n // 2:
            out.append(Event(t, EventKind.CONFIG_CHANGED, {"old": {"speculative_num_steps": 3},
                                                           "new": {"speculative_num_steps": 2}, "epoch": 2}))
    trace_json = b'{"traceEvents": []}'
    out.append(Trace(t0 + 1, "p1", 0, "p1-TP-0.trace.json.gz", gzip.compress(trace_json), {"mode": "cpu"}))
    out.append(Trace(t0 + 1, "p1", 1, "p1-TP-1.trace.json", trace_json, None))
    return out


def record(path, records, **header):
    rec = Recorder(path, {"backend": "refengine", **header})
    rec.write(records)
    rec.close()
    return rec


def test_round_trip_is_identical_and_one_file(tmp_path):
    path = tmp_path / "r.db"
    recs = some_records()
    rec = record(path, recs, server_info={"kind": "refengine"})
    assert rec.error is None and rec.written == len(recs)
    assert not Path(str(path) + "-wal").exists() and not Path(str(path) + "-shm").exists()
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    with open_recording(path) as r:
        assert r.problem is None
        assert r.header["schema_version"] == SCHEMA_VERSION and r.header["backend"] == "refengine"
        assert r.header["tool_version"] and "closed_at" in r.header
        got = list(r.records())
        assert got == recs
        assert r.t_first == 100.0 and r.t_last == recs[-3].t
        assert [tr.name for tr in r.traces()] == ["p1-TP-0.trace.json.gz", "p1-TP-1.trace.json"]
        assert len(list(r.records(101.0, 102.0))) == sum(1 for x in recs if 101.0 <= x.t <= 102.0)


def test_existing_file_is_not_overwritten_by_accident(tmp_path):
    path = tmp_path / "r.db"
    record(path, some_records(2))
    with pytest.raises(RecordingError, match="exists"):
        Recorder(path)
    record(path, some_records(3), overwrite=None) if False else Recorder(path, overwrite=True).close()
    with pytest.raises(RecordingError, match="cannot create"):
        Recorder(tmp_path / "no" / "such" / "dir.db")


def test_commits_about_every_second(tmp_path):
    path = tmp_path / "r.db"
    now = [0.0]
    rec = Recorder(path, {}, monotonic=lambda: now[0])
    rec.write(some_records(4))
    rec.flush()
    count = lambda: read_only_query(path, "SELECT count(*) FROM samples")[0]
    assert count() == 8
    rec.write([Sample(200.0, "x", 1.0)])
    rec.write([Sample(200.5, "x", 1.0)])      # nudges the writer: less than a second has passed
    wait_until(lambda: rec.written >= 13, 30, "the writer to take 13 records")  # 11 of some_records(4) + 2
    assert count() == 8                        # written but not yet committed
    now[0] = 1.5
    rec.write([Sample(201.0, "x", 1.0)])       # the next write after a second commits
    wait_until(lambda: rec.commits >= 2 and rec.written >= 14, 30, "the second commit")
    assert count() == 11
    rec.close()


KILLED_WRITER = r"""
import sys, time
from tuner.core.records import Sample
from tuner.recording import Recorder
rec = Recorder(sys.argv[1], {"backend": "refengine"})
i = 0
t_end = time.monotonic() + 60
while time.monotonic() < t_end:
    rec.write([Sample(float(i), "x", float(i))])
    i += 1
    if i == 2000:
        print("running", flush=True)
    time.sleep(0.0005)
"""


@pytest.mark.slow
def test_sigkill_loses_at_most_the_last_second(tmp_path):
    path = tmp_path / "killed.db"
    p = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    committed = lambda: read_only_query(path, "SELECT count(*) FROM samples")[0]
    try:
        assert p.stdout.readline().strip() == "running"
        # Let it commit a few times (a real process writing a real file): the count a reader sees
        # moves only at commits. The kill then lands between two commits.
        first = wait_until(committed, 60, "a first commit")
        seen = wait_until(lambda: (n := committed()) > first and n, 60, "a second commit")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert Path(str(path) + "-wal").exists()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    r = open_recording(path)
    assert "not closed cleanly" in r.problem and "private copy" in r.problem
    xs = [s.value for s in r.records()]
    assert xs == [float(i) for i in range(len(xs))]                        # a prefix, nothing torn
    assert len(xs) >= seen                       # what was committed before the kill survived it
    r.close()
    # Recovered in a private copy: the input and its -wal are as the killed writer left them.
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_not_a_recording_newer_schema_and_truncated(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"hello, this is not sqlite" * 100)
    with pytest.raises(RecordingError, match="not an SQLite file") as e:
        open_recording(junk)
    assert "\n" not in str(e.value)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE x (a)").connection.commit()
    with pytest.raises(RecordingError, match="not a specdecode-tune recording"):
        open_recording(other)
    with pytest.raises(RecordingError, match="no such"):
        open_recording(tmp_path / "missing.db")

    newer = tmp_path / "newer.db"
    record(newer, some_records(5))
    db = sqlite3.connect(newer)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.execute("CREATE TABLE future_stuff (a)")
    db.commit(); db.close()
    r = open_recording(newer)
    assert "newer" in r.problem and "99" in r.problem
    assert len(list(r.records())) == len(some_records(5))              # what it understands is read

    big = tmp_path / "big.db"
    recs = some_records(5000)
    record(big, recs)
    data = big.read_bytes()
    cut = tmp_path / "cut.db"
    cut.write_bytes(data[: len(data) // 2])
    r = open_recording(cut)
    got = list(r.records())
    assert "truncated" in r.problem and "\n" not in r.problem
    assert 0 < len(got) < len(recs)
    it = iter(recs)
    assert all(any(x == y for y in it) for x in got)          # what is read is the recorded order
    assert r.header["backend"] == "refengine"


def test_replay_virtual_clock_pause_speed_seek(tmp_path):
    path = tmp_path / "r.db"
    recs = some_records(40)                       # t = 100.0 .. 109.75
    record(path, recs, capabilities={"HAS_PHASE_TIMERS": True})
    real = [0.0]
    backend = ReplayBackend(path, paused=True, monotonic=lambda: real[0])
    session = Session(backend)
    assert session.clock is backend.clock and backend.READ_ONLY and not backend.capabilities.can_set("speculative_num_steps")
    assert backend.HAS_PHASE_TIMERS and backend.length_s == pytest.approx(9.75)
    session.start()
    session.tick()
    assert session.now() == 100.0 and session.store.value("server/tok_per_s") == 100.0
    real[0] = 5.0
    session.tick()                                # paused: nothing moves
    assert session.now() == 100.0
    backend.play()
    session.tick()
    real[0] = 6.0
    session.tick()                                # 1 real second at speed 1
    assert session.now() == 101.0 and session.store.value("server/tok_per_s") == 104.0
    backend.set_speed(4.0)
    real[0] = 7.0
    session.tick()
    assert session.now() == 105.0
    assert session.store.last_event(EventKind.CONFIG_CHANGED).t == 105.0
    backend.pause()
    session.seek(102.0)                           # backwards: the store is rebuilt up to 102
    assert session.now() == 102.0 and session.store.latest("server/tok_per_s").t == 102.0
    assert session.store.last_event(EventKind.CONFIG_CHANGED) is None
    assert session.server_info()["kind"] == "refengine"
    backend.step(0.5)
    session.tick()
    assert session.store.latest("server/tok_per_s").t == 102.5
    backend.play()
    session.tick()
    real[0] = 100.0
    session.tick()
    assert backend.ended and backend.paused and session.now() == backend.end_t
    assert not session.set_config({"speculative_num_steps": 2}).ok
    session.close()


def test_replay_seek_keeps_old_events_and_recent_history(tmp_path):
    path = tmp_path / "r.db"
    recs = some_records(400)                      # 100 s of samples
    record(path, recs)
    backend = ReplayBackend(path, paused=True, history_s=10.0)
    session = Session(backend).start()
    session.seek(190.0)
    st = session.store
    assert st.window("server/tok_per_s").t[0] == pytest.approx(180.0)
    assert st.last_event(EventKind.SERVER_INFO) is not None              # from t=100, kept
    assert st.last_event(EventKind.CONFIG_CHANGED).t == pytest.approx(150.0)
    session.close()


def test_record_then_replay_gives_the_same_records(tmp_path):
    path = tmp_path / "r.db"
    live = Session(clock=ManualClock(100.0), recorder=Recorder(path, {"backend": "refengine"}))
    recs = some_records(30)
    for r in recs:
        live.put(r)
        live.tick()
    live.close()
    seen = []

    class Sink:
        def write(self, records):
            seen.extend(records)

        def close(self):
            pass

    backend = ReplayBackend(path, paused=True)
    replay = Session(backend, recorder=Sink()).start()
    replay.tick()
    while not backend.ended:
        backend.step(1.0)
        replay.tick()
    assert seen == recs
    replay.close()
