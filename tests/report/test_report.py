"""`specdecode-tune report`: the figures from a recording with known readings, every output format,
the exports (Perfetto, CSV), bad files, and the HTML page in headless Chromium."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest

from headless_chromium import chromium_path, open_page
from synthetic import CHANGE_AT, FIG, GAP, T0, write
from tuner.cli import main
from tuner.recording import open_recording
from tuner.recording.schema import SCHEMA_VERSION
from tuner.report import load, summarize

# 60 s of the real engine (serve --tp-size 2, CPU, the shipped tiny model) under `record --load 4`, with
# three setting changes and one trace capture (the example report in docs/examples is made from it).
ENGINE_FIXTURE = Path(__file__).parent / "fixtures" / "cpu-engine.db"
LABELS = ["steps=3 topk=1 draft_tokens=4 placement=sharded", "steps=2 topk=1 draft_tokens=3 placement=sharded",
          "steps=4 topk=1 draft_tokens=5 placement=sharded", "steps=4 topk=1 draft_tokens=5 placement=replicated"]


@pytest.fixture
def synthetic(tmp_path) -> Path:
    return write(tmp_path / "synthetic.db", tuning=True)


@pytest.fixture
def engine_rec(tmp_path) -> Path:
    p = tmp_path / "engine.db"
    shutil.copy(ENGINE_FIXTURE, p)
    return p


def report(*args: str, capsys) -> tuple[int, str, str]:
    rc = main(["report", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


# -- the figures ----------------------------------------------------------------------------------------

def test_settings_figures_drop_settling_and_gaps_and_name_the_fastest_with_the_phase_split(synthetic):
    s = summarize(load(synthetic))
    assert [r.label for r in s.rows] == ["steps=3 topk=1 draft_tokens=4 placement=sharded",
                                         "steps=4 topk=1 draft_tokens=5 placement=rank0"]
    a, b = s.rows
    # The first 1.5 s after a change read 20 % of the real rate; settling (2 s) drops them all.
    assert a.tok_s == pytest.approx(FIG["A"]["tok"]) and b.tok_s == pytest.approx(FIG["B"]["tok"])
    assert len(a.windows) == int(CHANGE_AT - 2)
    # B: 30..45 then 50..70 (the gap left out, 2 s settled after each start).
    assert len(b.windows) == (45 - 32) + (70 - 52)
    assert b.seconds == pytest.approx((GAP[0] - CHANGE_AT) + (70 - GAP[1]))
    assert a.phase_ms["verify"] == pytest.approx(40.0) and a.comm_ms["verify"] == pytest.approx(20.0)
    assert a.comm_share("draft") == pytest.approx(0.6) and a.comm_share("verify") == pytest.approx(0.5)
    assert a.accept_pos == pytest.approx({1: 0.9, 2: 0.7, 3: 0.4}) and b.accept_pos[4] == pytest.approx(0.2)
    assert a.wall_ms == pytest.approx(60.0) and b.wall_ms == pytest.approx(50.0)
    assert s.gaps == [(T0 + GAP[0], T0 + GAP[1], "connection refused")]
    v = s.verdict
    assert v.best is b and v.other is a and v.ratio == pytest.approx(1.3)
    assert v.lo == pytest.approx(1.3) and v.hi == pytest.approx(1.3)     # no noise at all
    text = " ".join(v.sentences)
    assert "+30.0 %" in text
    assert "accept length 3.00 → 3.50" in text and "iteration time 60.00 → 50.00 ms" in text
    # The phases that moved most come first, each with its collective part beside it.
    assert "draft 10.00 → 4.00 ms (-6.00, of which collectives -6.00 ms (6.00 → 0.00))" in text
    assert text.index("draft 10.00") < text.index("draft_extend 5.00")


def test_gpu_readings_are_summarised_per_setting(synthetic, tmp_path, capsys):
    """NVML means per setting (NaN readings skipped), in the JSON, the Markdown and the HTML."""
    s = summarize(load(synthetic))
    a, b = s.rows
    assert a.gpus[0]["sm_active_pct"] == pytest.approx(50.0) and b.gpus[0]["sm_active_pct"] == pytest.approx(60.0)
    assert math.isnan(a.gpus[0]["power_w"]), "a series never recorded is n/a, not 0"
    md = tmp_path / "r.md"
    assert report(synthetic, "--out", md, capsys=capsys)[0] == 0
    text = md.read_text()
    assert "### GPUs per setting" in text
    assert "| steps=4 topk=1 draft_tokens=5 placement=rank0 | 0 | 60.0 | n/a | n/a | n/a | n/a / n/a | n/a / n/a |" in text
    html = tmp_path / "r.html"
    assert report(synthetic, "--out", html, capsys=capsys)[0] == 0
    assert "Per setting (NVML" in html.read_text()
    js = tmp_path / "r.json"
    assert report(synthetic, "--out", js, capsys=capsys)[0] == 0
    rows = json.loads(js.read_text())["settings"]
    assert rows[1]["gpus"]["0"]["sm_active_pct"] == pytest.approx(60.0)


def test_tuning_events_and_predictions_are_tabled(synthetic):
    s = summarize(load(synthetic))
    assert [t["kind"] for t in s.tuning] == ["tuning_prediction", "tuning_applied"]
    assert "model: best steps 4 topk 1 draft 5 rank0 predicted 128.0" in s.tuning[0]["summary"]
    assert len(s.predictions) == 2
    html = (main(["report", str(synthetic), "--out", str(synthetic.with_suffix(".html"))]),
            synthetic.with_suffix(".html").read_text())[1]
    assert "<h2>Tuning</h2>" in html and "Predictions (last fit)" in html and "128.0" in html


def test_emulated_links_are_flagged_as_emulation(tmp_path, capsys):
    p = write(tmp_path / "emu.db", emulate="200,5")
    rc, _, _ = report(p, "--out", tmp_path / "r.html", capsys=capsys)
    assert rc == 0
    html = (tmp_path / "r.html").read_text()
    assert 'class="banner flag">EMULATED slow link' in html and "--emulate-comm-latency 200,5" in html
    rc, _, _ = report(p, "--out", tmp_path / "r.md", capsys=capsys)
    assert "**EMULATED slow link" in (tmp_path / "r.md").read_text()
    data = json.loads((report(p, "--out", "-", "--format", "json", capsys=capsys))[1])
    assert data["flags"][0].startswith("EMULATED")
    assert data["server"]["launch"]["api_key"] == "***"                     # secrets never reach a report


# -- formats ----------------------------------------------------------------------------------------------

def test_html_report_is_one_self_contained_page_with_the_charts(engine_rec, tmp_path, capsys):
    out = tmp_path / "report.html"
    rc, _, err = report(engine_rec, "--out", out, capsys=capsys)
    assert rc == 0, err
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for forbidden in ("<script", "src=", "<link", "@import", "url("):
        assert forbidden not in html, forbidden
    assert html.count("<svg") >= 5
    for title in ("Throughput over time", "Accept length over time", "Where an iteration", "Per-position acceptance p_k"):
        assert title in html
    for label in LABELS:
        assert label in html
    assert "is the fastest" in html and "Phase split per iteration" in html
    assert "collective share of draft" in html
    assert "specdecode-tune 0.1.0" in html and "launch_command" in html
    assert "fastest" in err and "wrote" in err


def test_markdown_and_json_by_extension_or_format(engine_rec, tmp_path, capsys):
    rc, _, _ = report(engine_rec, "--out", tmp_path / "r.md", capsys=capsys)
    md = (tmp_path / "r.md").read_text()
    assert rc == 0 and md.startswith("# specdecode-tune report") and "| setting |" in md and "is the fastest" in md
    rc, _, _ = report(engine_rec, "--out", tmp_path / "r.json", capsys=capsys)
    data = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and [r["label"] for r in data["settings"]] == LABELS and data["fastest"]["best"]
    assert data["recording"]["schema_version"] == 1 and data["report"]["version"]
    assert data["captures"][0]["mode"] == "cpu" and data["captures"][0]["ranks"] == 2
    rc, out, _ = report(engine_rec, "--out", tmp_path / "x.txt", "--format", "md", capsys=capsys)
    assert rc == 0 and (tmp_path / "x.txt").read_text().startswith("# specdecode-tune")
    rc, _, err = report(engine_rec, "--out", tmp_path / "x.pdf", capsys=capsys)
    assert rc == 2 and "cannot tell the format" in err and err.count("\n") == 1


def test_perfetto_trace_has_kernels_or_ops_phase_spans_and_counter_tracks(engine_rec, tmp_path, capsys):
    out = tmp_path / "trace.json"
    rc, _, err = report(engine_rec, "--perfetto", out, capsys=capsys)
    assert rc == 0, err
    doc = json.loads(out.read_text())
    evs = doc["traceEvents"]
    counters = {e["name"] for e in evs if e["ph"] == "C"}
    assert {"server/tok_per_s", "spec/accept_len", "phase/draft_ms"} <= counters
    procs = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert any(p.startswith("rank 0 · capture") for p in procs) and any(p.startswith("rank 1 · capture") for p in procs)
    spans = [e for e in evs if e["ph"] == "X" and e["pid"] >= 100]
    names = {e["name"] for e in spans}
    assert "draft" in names and any(n.startswith("step[VERIFY") or n == "verify" for n in names)
    assert any(n.startswith("specdecode.comm.") for n in names)            # our collective spans
    settings = [e for e in evs if e["ph"] == "X" and e["pid"] == 1 and e.get("cat") == "setting"]
    assert sorted({e["name"] for e in settings}) == sorted(LABELS)
    # Captured spans sit on the recording's time axis, inside the recording.
    rec = open_recording(engine_rec)
    length_us = (rec.t_last - rec.t_first) * 1e6
    assert all(-5e6 < e["ts"] < length_us + 5e6 for e in spans)


def test_csv_exports_every_sample_in_long_format(engine_rec, tmp_path, capsys):
    rc, _, err = report(engine_rec, "--csv", tmp_path / "csv", capsys=capsys)
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO((tmp_path / "csv" / "samples.csv").read_text())))
    rec = open_recording(engine_rec)
    n = sum(1 for _ in rec.records(kinds=("samples",)))
    assert len(rows) == n and set(rows[0]) == {"t", "t_rel_s", "series", "value"}
    assert {r["series"] for r in rows} == set(rec.series_names())
    settings = list(csv.DictReader((tmp_path / "csv" / "settings.csv").open()))
    assert [r["label"] for r in settings] == LABELS and "phase_ms.verify" in settings[0]
    events = list(csv.DictReader((tmp_path / "csv" / "events.csv").open()))
    assert any(e["kind"] == "config_changed" for e in events)


# -- bad input ------------------------------------------------------------------------------------------

def test_a_file_that_is_not_a_recording_is_one_line(tmp_path, capsys):
    p = tmp_path / "notes.txt"
    p.write_text("hello\n" * 100)
    rc, _, err = report(p, "--out", tmp_path / "r.html", capsys=capsys)
    assert rc == 1 and err.count("\n") == 1 and "not a specdecode-tune recording" in err
    db = tmp_path / "other.db"
    sqlite3.connect(db).execute("CREATE TABLE x (y)").connection.commit()
    rc, _, err = report(db, "--out", tmp_path / "r.html", capsys=capsys)
    assert rc == 1 and err.count("\n") == 1 and "not a specdecode-tune recording" in err
    rc, _, err = report(tmp_path / "missing.db", capsys=capsys)
    assert rc == 1 and "no such file" in err
    assert not (tmp_path / "r.html").exists()


def test_a_newer_schema_is_said_and_what_is_understood_is_reported(synthetic, tmp_path, capsys):
    db = sqlite3.connect(synthetic)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    rc, _, err = report(synthetic, "--out", tmp_path / "r.html", capsys=capsys)
    assert rc == 0
    assert f"newer specdecode-tune (schema 99 > {SCHEMA_VERSION})" in err
    html = (tmp_path / "r.html").read_text()
    assert "Recording problem:" in html and "schema 99" in html and "is the fastest" in html


def test_a_truncated_recording_reports_what_is_left(synthetic, tmp_path, capsys):
    data = synthetic.read_bytes()
    cut = tmp_path / "cut.db"
    cut.write_bytes(data[: len(data) * 2 // 3])
    rc, _, err = report(cut, "--out", tmp_path / "r.json", capsys=capsys)
    assert rc == 0 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert any("is truncated (" in line for line in lines)
    assert all(line.startswith("specdecode-tune report: ") for line in lines)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["recording"]["problems"]
    # The readings before the cut are all there: the first setting's 28 settled windows at 100 tok/s.
    first = doc["settings"][0]
    assert first["windows"] == CHANGE_AT - 2 and first["tok_per_s_median"] == pytest.approx(100.0)


def test_a_corrupt_recording_reports_what_is_readable_on_both_sides_of_the_damage(synthetic, tmp_path, capsys):
    data = bytearray(synthetic.read_bytes())
    bad = tmp_path / "bad.db"
    page = int.from_bytes(data[16:18], "big")
    # Overwrite three pages in the middle of the file with garbage (the header page stays intact).
    mid = (len(data) // page // 2) * page
    data[mid: mid + 3 * page] = b"\xa5" * (3 * page)
    bad.write_bytes(bytes(data))
    rc, _, err = report(bad, "--out", tmp_path / "r.md", capsys=capsys)
    assert rc == 0 and "Traceback" not in err
    assert any("corrupt" in line and "unreadable up to seq" in line for line in err.splitlines()), err
    md = (tmp_path / "r.md").read_text()
    assert "Recording problem:" in md
    doc = json.loads(report(bad, "--out", "-", "--format", "json", capsys=capsys)[1])
    assert [r["tok_per_s_median"] for r in doc["settings"]] == pytest.approx([100.0, 130.0])
    assert doc["recording"]["length_s"] == pytest.approx(70.0)


# -- in a real browser ------------------------------------------------------------------------------------

CHROMIUM = chromium_path()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; .ci/run does)")
def test_html_report_in_headless_chromium_has_no_console_errors_and_draws_the_charts(tmp_path, capsys):
    from PIL import Image

    # The detector must be able to fail: a page with a console error, a throw and a missing image.
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><p>x</p><script>console.error("boom"); throw new Error("bang")</script>'
                   '<img src="missing.png">')
    control = open_page(CHROMIUM, bad, selector="p")
    assert any("boom" in p for p in control.problems) and any("bang" in p for p in control.problems)
    assert any("ERR_FILE_NOT_FOUND" in p for p in control.problems)

    rec = write(tmp_path / "gpu.db", tuning=True)     # has a GPU series, a gap, tuning
    for src in (rec, ENGINE_FIXTURE):
        out = tmp_path / f"{src.stem}.html"
        rc, _, err = report(src, "--out", out, capsys=capsys)
        assert rc == 0, err
        page = open_page(CHROMIUM, out, selector="svg.chart")
        assert page.problems == [], page.problems
        assert page.requests == [out.resolve().as_uri()]          # nothing fetched but the page itself
        img = Image.open(io.BytesIO(page.png)).convert("RGB")
        charts = [b for b in page.boxes if "empty" not in b["cls"]]
        assert len(charts) >= 5, page.boxes
        for box in charts:
            region = img.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["w"]), int(box["y"] + box["h"])))
            colours = region.getcolors(maxcolors=1 << 20)
            inked = sum(n for n, c in colours if max(c) - min(c) > 60)     # saturated: data, not text or grid
            assert region.size[0] > 300 and region.size[1] > 150, box
            assert inked > 400, f"{box['label']!r} looks blank ({inked} coloured pixels)"
        if src == rec:
            assert any("per GPU" in b["label"] for b in charts)


def test_prefill_is_its_own_column_and_bar_segment(synthetic, engine_rec, tmp_path, capsys):
    a, b = summarize(load(synthetic)).rows
    assert a.phase_ms["prefill"] == pytest.approx(2.0) and a.comm_ms["prefill"] == pytest.approx(0.5)
    md = tmp_path / "r.md"
    assert report(synthetic, "--out", md, capsys=capsys)[0] == 0
    head, _, first = md.read_text().split("## Settings tried")[1].strip().splitlines()[:3]
    cols = [c.strip() for c in head.strip("|").split("|")]
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cols.index("prefill ms (comm)") < cols.index("draft ms (comm)")
    assert cells[cols.index("prefill ms (comm)")] == "2.00 (0.50)"
    html = tmp_path / "r.html"
    assert report(synthetic, "--out", html, capsys=capsys)[0] == 0
    page = html.read_text()
    # The stacked bar of each setting has a prefill segment, in its own colour and the legend.
    assert page.count(": prefill 2.000</title></rect>") == 1 and ": prefill 1.000</title></rect>" in page
    assert ">prefill ms<" in page or "prefill ms" in page
    # A recording from before prefill was a phase: no prefill column, nothing else missing.
    old = tmp_path / "old.md"
    assert report(engine_rec, "--out", old, capsys=capsys)[0] == 0
    text = old.read_text()
    assert "prefill" not in text and "draft ms (comm)" in text
