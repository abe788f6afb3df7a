"""The TUI commands' bad input: one line on stderr, a non-zero status, no traceback, no TUI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_attach_to_nothing(tmp_path):
    out = run("attach", f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert "cannot connect" in one_line(out.stderr)


@pytest.mark.parametrize("args,needle", [
    (["--load", "-1"], "--load must be 0 or more"),
    (["--prompts", "PROMPTS"], 'needs "text"'),
    (["--tune-budget", "soon"], "--tune-budget: not a duration"),
    (["--tune-max-steps", "0"], "--tune-max-steps must be between 1 and 64"),
    (["--tune-topk", "1,four"], "--tune-topk: not a comma-separated list of integers"),
    (["--tune-slo", "itl_p99<40ms"], "--tune-slo: "),
])
def test_attach_bad_options(tmp_path, args, needle):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"x": 1}\n')
    args = [str(prompts) if a == "PROMPTS" else a for a in args]
    out = run("attach", f"http://127.0.0.1:{free_port()}", *args)
    assert out.returncode == 2 and needle in one_line(out.stderr)


def test_replay_of_what_is_not_a_recording(tmp_path):
    bogus = tmp_path / "notes.db"
    bogus.write_text("hello\n")
    out = run("replay", str(bogus))
    assert out.returncode == 1 and "not a specdecode-tune recording" in one_line(out.stderr)
    missing = run("replay", str(tmp_path / "nope.db"))
    assert missing.returncode == 1 and "no such file" in one_line(missing.stderr)
    speed = run("replay", str(bogus), "--speed", "0")
    assert speed.returncode == 2 and "--speed" in one_line(speed.stderr)
