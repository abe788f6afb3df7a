"""`specdecode-tune record` against the real engine (`serve --tp-size 2`, CPU): the recording holds
exactly what the session drained (traces and their analyses included) and replays record for record;
SIGINT ends it cleanly; SIGKILL leaves a file that opens with at most about a second missing; a
server that goes away leaves a marked gap and the recording resumes when it is back."""

from __future__ import annotations

import argparse
import io
import math
import signal
import threading
import time

import pytest

from harness import read_only_query, wait_until
from report_helpers import Recording, free_port, start_engine
from tuner.backends import connect
from tuner.cli import main
from tuner.commands.record import Progress, parse_duration, parse_set_at
from tuner.core.driver import Driver, ScheduledChange
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample, Trace
from tuner.core.session import Session
from tuner.recording import Recorder, ReplayBackend, header_for, open_recording
from tuner.report import load, summarize


# -- pure parsing -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("5m", 300), ("2h", 7200), ("1h30m", 5400),
                                            ("1.5h", 5400), ("250ms", 0.25), (" 10 s ", 10), ("1d", 86400)])
def test_durations_in_seconds_or_with_a_unit(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "5x", "-3", "0", "5m-3", "m", "1e3"])
def test_bad_durations_are_one_line_errors(text):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse_duration(text)
    assert "\n" not in str(e.value) and "duration" in str(e.value)


def test_set_at_parses_time_key_and_typed_value():
    c = parse_set_at("20s:speculative_num_steps=4")
    assert (c.at_s, c.key, c.value) == (20.0, "speculative_num_steps", 4)
    assert parse_set_at("1m:speculative_draft_placement=rank0").value == "rank0"
    with pytest.raises(argparse.ArgumentTypeError):
        parse_set_at("speculative_num_steps=4")


# -- against the real engine ------------------------------------------------------------------------------

class Tee:
    """The recorder, plus a copy of exactly what the session handed it."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.records: list = []
        self.written = 0

    def write(self, records):
        self.records.extend(records)
        self.rec.write(records)
        self.written = self.rec.written

    def close(self):
        self.rec.close()


@pytest.mark.slow
def test_round_trip_records_traces_and_analyses_then_replays_record_for_record(engine_tp2, tmp_path):
    backend = connect(engine_tp2.url)
    path = tmp_path / "rt.db"
    tee = Tee(Recorder(path, header_for(backend, command="test")))
    session = Session(backend, recorder=tee)
    session.start()
    session.start_load([{"text": "def main(argv=None):\n"}, {"text": "class Cache:\n    def __init__(self"}], 2,
                       max_new_tokens=32)
    loop = Driver(session, capture_every_s=3.0, capture_steps=3,
                  schedule=[ScheduledChange(2.0, "speculative_num_steps", 2)])
    loop.run(threading.Event(), duration_s=14.0)
    session.close()
    assert loop.captures >= 1, f"no capture finished ({loop.capture_failures} failed)"

    drained = tee.records
    reader = open_recording(path)
    assert reader.problem is None
    stored = list(reader.records())
    assert len(stored) == len(drained) > 100
    assert stored == drained                      # record for record, in the session's order
    kinds = {type(r) for r in stored}
    assert kinds == {Sample, Event, Trace}
    traces = [r for r in stored if isinstance(r, Trace)]
    assert {t.rank for t in traces} == {0, 1}
    analysed = [t for t in traces if t.analysis is not None]
    assert analysed and analysed[0].analysis["mode"] == "cpu" and len(analysed[0].analysis["ranks"]) == 2
    assert any(e.kind == EventKind.CONFIG_CHANGED and e.data["new"]["speculative_num_steps"] == 2
               for e in stored if isinstance(e, Event))
    assert reader.header["command"] == "test" and reader.header["backend"] == "refengine"
    reader.close()

    # The replay backend feeds the same records back through a session, in the same order.
    replayed: list = []

    class Sink:
        def write(self, records):
            replayed.extend(records)

        def close(self):
            pass

    rb = ReplayBackend(path, paused=True)
    rs = Session(rb, recorder=Sink())
    rs.start()
    rb.step(rb.length_s + 1.0)
    rs.tick()
    rs.close()
    assert replayed == drained


@pytest.mark.slow
def test_record_command_stops_cleanly_on_sigint_and_prints_progress(engine_tp2, tmp_path):
    out = tmp_path / "clean.db"
    probe = connect(engine_tp2.url)
    steps = 2 if probe.info["active"]["speculative_num_steps"] != 2 else 3   # a real change, whatever ran before
    probe.stop()
    rec = Recording(engine_tp2.url, out, "--load", "2", "--max-new-tokens", "32", "--progress-every", "1",
                    "--set-at", f"3s:speculative_num_steps={steps}")
    rec.wait_started()
    assert rec.wait_for_line(f"→{steps}", 60) and "now running steps " in rec.stderr(), rec.stderr()
    rec.signal(signal.SIGINT)
    assert rec.wait() == 0, rec.stderr()
    err = rec.stderr()
    assert "wrote" in err and str(out) in err
    progress = [line for line in rec.err if line.startswith("recording 0:")]
    assert len(progress) >= 2 and "tok/s" in progress[-1]          # periodic lines when not a terminal
    assert not (tmp_path / "clean.db-wal").exists()                 # one self-contained file
    r = open_recording(out)
    assert r.problem is None and "closed_at" in r.header
    assert r.header["record"]["load"] == 2 and "record" in r.header["command"]
    names = r.series_names()
    assert S.SERVER_TOK_PER_S in names and S.phase_ms("draft") in names and S.LOAD_TOK_PER_S in names
    assert any(e.kind == "config_requested" for e in r.events())
    r.close()


@pytest.mark.slow
def test_sigkill_leaves_a_file_that_opens_with_at_most_about_a_second_missing(engine_tp2, tmp_path):
    out = tmp_path / "killed.db"
    rec = Recording(engine_tp2.url, out, "--load", "2", "--max-new-tokens", "32")
    rec.wait_started()
    # What a reader sees moves only at commits (about every second of readings): wait for phase
    # readings to be committed, then for one more commit, and kill between two commits.
    newest = lambda: read_only_query(out, "SELECT count(*), max(t) FROM samples")
    first = wait_until(lambda: (c := newest())[0] > 50 and c, 120, "readings committed to the file")
    seen = wait_until(lambda: (c := newest())[0] > first[0] and c, 60, "one more commit")
    rec.signal(signal.SIGKILL)
    rec.wait()
    r = open_recording(out)                       # recovers the WAL, says it was not closed cleanly
    assert r.problem and "not closed cleanly" in r.problem
    stored = list(r.records())
    # Everything committed before the kill survived it; what is lost is at most the uncommitted
    # tail (the commit rule itself is tested on a manual clock in tests/core/test_recording.py).
    assert len([x for x in stored if isinstance(x, Sample)]) >= seen[0]
    assert r.t_last >= seen[1]
    r.close()


@pytest.mark.slow
def test_a_server_that_goes_away_leaves_a_marked_gap_and_recording_resumes(tmp_path):
    port = free_port()
    args = ("--tp-size", "2", "--port", str(port), "--max-running-requests", "2")
    server = start_engine(*args)
    url = server.url
    out = tmp_path / "gap.db"
    rec = Recording(url, out, "--load", "1", "--max-new-tokens", "24", "--progress-every", "1")
    committed_since = lambda t: read_only_query(out, "SELECT count(*) FROM samples WHERE t >= ?", t)[0]
    try:
        rec.wait_started()
        wait_until(lambda: committed_since(0.0) > 20, 120, "readings from the first server")
        stop_started = time.time()
        assert server.stop(timeout=60.0) == 0
        assert rec.wait_for_line("disconnected: ", 30), rec.stderr()
        server = start_engine(*args)
        assert rec.wait_for_line("s away", 60), rec.stderr()
        back_seen = time.time()
        wait_until(lambda: committed_since(back_seen) > 20, 120, "readings from the restarted server")
        # Any 20 samples can be one metrics scrape: wait for what is asserted below, phase readings
        # from the restarted server's iterations (the phase poller reconnects on its own schedule).
        wait_until(lambda: read_only_query(
            out, "SELECT count(*) FROM samples JOIN series ON series.id = samples.series_id "
                 "WHERE series.name = ? AND samples.t >= ? AND samples.value IS NOT NULL",
            S.phase_ms("draft"), back_seen)[0] > 0, 120, "phase readings from the restarted server")
        wait_until(lambda: read_only_query(out, "SELECT count(*) FROM events WHERE kind = 'server_info'")[0] >= 2,
                   120, "the restarted server's server_info in the file")
        rec.signal(signal.SIGTERM)
        assert rec.wait() == 0, rec.stderr()
    finally:
        if rec.proc.poll() is None:
            rec.proc.kill()
        server.stop(timeout=60.0)
    r = open_recording(out)
    assert r.problem is None
    events = r.events()
    gone = [e for e in events if e.kind == EventKind.DISCONNECTED]
    back = [e for e in events if e.kind == EventKind.CONNECTED and float(e.data.get("after_s") or 0) > 0]
    assert gone and back and back[0].t > gone[0].t
    assert gone[0].t >= stop_started
    assert len([e for e in events if e.kind == EventKind.SERVER_INFO]) >= 2     # the new server said who it is
    # Readings carry on after the server is back.
    after = [x for x in r.records(back[0].t) if isinstance(x, Sample) and x.series == S.phase_ms("draft")
             and not math.isnan(x.value)]
    assert after, "no phase readings after the server came back"
    assert r.t_last >= back_seen
    r.close()
    # The report marks the gap.
    summary = summarize(load(out))
    assert len(summary.gaps) == 1
    g0, g1, err = summary.gaps[0]
    # The gap is the recorded one: from the disconnect (or when the server was last seen) to the
    # reconnection; how long it lasted depends on the machine, not on the recorder.
    assert (g0, g1) == (float(gone[0].data.get("since", gone[0].t) or gone[0].t), back[0].t) and g1 > g0 and err


# -- progress and refusals (no server) --------------------------------------------------------------------

class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_progress_is_one_line_in_place_on_a_terminal_and_periodic_lines_otherwise():
    now = [0.0]
    tty = Progress(_Stream(True), monotonic=lambda: now[0])
    for i in range(5):
        tty.update(f"recording {i}")
        now[0] += 0.6
    tty.say("server gone")
    tty.update("recording 9")
    tty.end()
    text = tty.stream.getvalue()
    assert text.count("\r\x1b[2K") >= 5 and text.count("\n") == 2       # the message and the final newline
    assert "recording 4" in text and "server gone\n" in text

    now[0] = 0.0
    log = Progress(_Stream(False), every_s=10.0, monotonic=lambda: now[0])
    for i in range(25):
        log.update(f"recording {i}")
        now[0] += 1.0
    lines = log.stream.getvalue().splitlines()
    assert lines == ["recording 0", "recording 10", "recording 20"]      # no control characters in logs
    log.end()


def test_record_refuses_in_one_line_without_leaving_a_file(tmp_path, capsys):
    out = tmp_path / "x.db"
    assert main(["record", "http://127.0.0.1:1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot connect" in err and not out.exists()
    out.write_text("keep me")
    assert main(["record", "http://127.0.0.1:1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--overwrite" in err and out.read_text() == "keep me"
    with pytest.raises(SystemExit):
        main(["record", "http://127.0.0.1:1", "--out", str(out), "--duration", "soon"])
    assert "not a duration" in capsys.readouterr().err
    assert main(["record", "http://127.0.0.1:1", "--out", str(tmp_path / "y.db"), "--nvml-hz", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nvml-hz" in err and not (tmp_path / "y.db").exists()
