"""A recording made before fleet recordings (schema 1: no server column, one server) still reads,
reports and replays as it did. The committed 60-s CPU engine recording is that old file: it must
stay schema 1 (a newer file here would prove nothing)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tuner.recording import open_recording
from tuner.recording.replay import ReplayBackend
from tuner.report import load, summarize
from tuner.report.markdown import render

OLD = Path(__file__).parent / "fixtures" / "cpu-engine.db"


def test_the_old_fixture_is_schema_1():
    db = sqlite3.connect(f"file:{OLD}?mode=ro&immutable=1", uri=True)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
        columns = {r[1] for r in db.execute("PRAGMA table_info(samples)")}
    finally:
        db.close()
    assert "server" not in columns


def test_an_old_recording_reads_reports_and_replays():
    with open_recording(OLD) as reader:
        assert reader.problem is None and reader.header["backend"] == "refengine"
        n = sum(1 for _ in reader.records())
    assert n > 1000
    data = load(OLD)
    assert not data.problems
    summary = summarize(data)
    text = render(summary)
    assert "placement=replicated" in text and "Fleet" not in text        # one server: no fleet summary
    assert summary.verdict is not None
    backend = ReplayBackend(OLD, paused=True)
    try:
        assert backend.problem is None and backend.info and backend.length_s > 50
    finally:
        backend.reader.close()
