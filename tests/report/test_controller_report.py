"""The report's "adaptive controller vs the tuned schedule" section, from recordings: one recorded
live (the real Session, Recorder and Driver with the controller watch, against the core's HTTP
stand-in of an adaptive SGLang without our plugin), and one holding a check over phase records with
known costs."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import pytest

from tests.tuning.synth import Stream, Truth
from tuner.backends import connect
from tuner.cli import main
from tuner.core.driver import Driver
from tuner.core.records import Event
from tuner.core.session import Session
from tuner.recording import Recorder, header_for
from tuner.tuning import controller_check as CC
from tuner.tuning.controller_watch import ControllerWatch
from tuner.tuning.observations import parse_record, settle
from tuner.tuning.settings import Setting

from tests.report.synthetic import write

_spec = importlib.util.spec_from_file_location(
    "core_standin_for_report", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)


def _report(capsys, path: Path, out: Path) -> str:
    rc = main(["report", str(path), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    return out.read_text()


def test_a_recorded_session_of_an_adaptive_sglang_reports_the_tier_it_ran(tmp_path, capsys):
    standin = core_standin.StandIn(kind="sglang", adaptive=True).start()
    path = tmp_path / "adaptive.db"
    try:
        backend = connect(standin.url)
        session = Session(backend, recorder=Recorder(path, header_for(backend, command="test")))
        watch = ControllerWatch(session, every_s=0.2)
        driver = Driver(session, watch=watch)
        session.start()
        driver.run(threading.Event(), tick_s=0.05, duration_s=60, until=lambda: watch.checks > 0)
        assert watch.checks > 0
        driver.close()
        session.close()
    finally:
        standin.stop()
    md = _report(capsys, path, tmp_path / "r.md")
    assert "## Adaptive controller vs the tuned schedule (approximate)" in md
    row = next(line for line in md.splitlines() if line.startswith("| 2–3 "))
    assert "steps 3 (100 %)" in row and "no fit" in row
    assert "Approximate: sglang:spec_num_steps sampled against sglang:num_running_reqs" in md
    html = _report(capsys, path, tmp_path / "r.html")
    assert "Adaptive controller vs the tuned schedule (approximate)</h2>" in html
    doc = json.loads(_report(capsys, path, tmp_path / "r.json"))
    assert doc["adaptive_controller"]["approximate"] is True


def test_a_check_over_phase_records_reports_the_tok_s_lost(tmp_path, capsys):
    truth = Truth(verify_n=2.5, step=1.5, off_verify=9.0)
    stream = Stream(truth, seed=7)
    recs = []
    for steps, n in ((5, 200), (1, 60), (2, 60)):
        recs += [{**r, "adaptive": True} for r in stream.records(Setting(steps), n, bs=8, new_epoch=False)]
    doc = CC.check_from_iterations(settle([parse_record(r) for r in recs], warmup_iters=20, warmup_s=0.0))
    path = write(tmp_path / "rec.db")
    # The synthetic recording plus the watch's event, appended through the real Recorder.
    extra = tmp_path / "with_check.db"
    rec = Recorder(extra, {"backend": "refengine", "url": "http://127.0.0.1:1", "command": "synthetic"})
    from tuner.recording import open_recording
    reader = open_recording(path)
    rec.write(list(reader.records()))
    reader.close()
    rec.write([Event(1_800_000_060.0, CC.EVENT_KIND, doc)])
    rec.close()
    md = _report(capsys, extra, tmp_path / "r.md")
    assert "## Adaptive controller vs the tuned schedule" in md and "(approximate)" not in md
    row = next(line for line in md.splitlines() if line.startswith("| 8–15 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].startswith("steps 5 (")
    assert cells[3] in ("steps 1", "steps 2")
    lost = float(cells[7].split()[0])
    best = truth.tok_s(Setting(int(cells[3].split()[1])), 8)
    assert lost == pytest.approx(best - truth.tok_s(Setting(5), 8), rel=0.2)
    assert "Tier from the phase records' batch size and steps" in md
    pct = row.split("(")[-1].split("%")[0].strip()
    assert f"The controller's tiers against the tuner's best: −{doc['overall']['loss_pct']:.1f} % overall " \
           "(predicted, 1 batch bucket weighted by time)" in md
    assert float(pct) == pytest.approx(doc["overall"]["loss_pct"], abs=0.6)


def test_a_server_without_a_controller_has_no_such_section(tmp_path, capsys):
    md = _report(capsys, write(tmp_path / "plain.db"), tmp_path / "r.md")
    assert "Adaptive controller" not in md
