"""`specdecode-tune analyze` as a user runs it: a real subprocess, table or JSON, one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "sglang_gpu"
ROOT = Path(__file__).resolve().parents[2]


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", "analyze", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_table_for_a_directory_names_the_mode_and_every_phase():
    out = analyze(FIXTURES)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("mode: gpu")
    for word in ("rank 0", "rank 1", "draft", "verify_sample", "draft_extend", "other",
                 "across ranks [0, 1]", "slowest rank 1"):
        assert word in out.stdout
    assert "warning: rank 0: 1 kernels" in out.stdout


def test_json_for_one_file():
    out = analyze(FIXTURES / "1764490000.5-TP-1.trace.json.gz", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["mode"] == "gpu" and d["across"] is None and d["ranks"][0]["rank"] == 1
    assert d["ranks"][0]["mean"]["phases"]["verify"]["ms"] == 0.15


def test_cpu_capture_table(cpu_capture):
    out = analyze(cpu_capture)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("mode: cpu")


def _truncated_gz(tmp_path: Path, age_s: float = 3600.0) -> Path:
    raw = (FIXTURES / "1764490000.5-TP-0.trace.json.gz").read_bytes()
    p = tmp_path / "cut-TP-0.trace.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    then = time.time() - age_s         # cut short long ago: a broken file, not one being written
    os.utime(p, (then, then))
    return p


def test_a_file_cut_short_that_just_changed_is_still_being_written(tmp_path):
    out = analyze(_truncated_gz(tmp_path, age_s=0.0))
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("specdecode-tune analyze: cut-TP-0.trace.json.gz: still being written (changed ")
    assert line.endswith("ends early): wait and retry")


def _invalid_json(tmp_path: Path) -> Path:
    p = tmp_path / "bad-TP-0.trace.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "draft", "ts": 1,, }]}')
    return p


def _no_phases(tmp_path: Path) -> Path:
    p = tmp_path / "plain-TP-0.trace.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 3,
                                    "pid": 1, "tid": 1}]}, f)
    return p


def _empty_dir(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


@pytest.mark.parametrize("make, message", [
    (_truncated_gz, "truncated or corrupt gzip"),
    (_invalid_json, "invalid JSON"),
    (_no_phases, "neither GPU kernels nor phase spans"),
    (_empty_dir, "no trace files"),
    (lambda tmp: tmp / "missing.trace.json.gz", "no such file"),
])
def test_bad_input_is_one_line_and_nonzero(tmp_path, make, message):
    out = analyze(make(tmp_path))
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr
