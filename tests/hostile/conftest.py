"""Fixtures for the hostile-server tests: the server (hostile_server.py) and a command runner that
runs `python -m tuner ...` as a real child process and returns its output and peak memory."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hostile.hostile_server import HostileServer

ROOT = Path(__file__).resolve().parents[2]
# A hang detector, not a timing assertion: a command that has not ended by then never will.
HANG_S = 180.0


@dataclass
class Ran:
    rc: int
    out: str
    err: str
    max_rss_mb: float


def _peak_rss_mb(pid: int, done: threading.Event, peak: list[float]) -> None:
    """Sample the child's VmHWM (the high-water mark of its own address space, set after exec).
    wait4's ru_maxrss is no good here: Linux carries the parent's high-water mark into a forked
    child at exec, so a child of a pytest process that has loaded torch reads as that big."""
    while not done.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak[0] = max(peak[0], int(line.split()[1]) / 1024.0)
        except OSError:
            return
        time.sleep(0.02)


def run_cli(*args: str, env: dict | None = None) -> Ran:
    """Run `python -m tuner ARGS` to its end; its peak RSS is sampled from /proc while it runs."""
    full_env = {k: v for k, v in os.environ.items() if k != "SPECDECODE_API_KEY"}
    full_env.update(PYTHONPATH=str(ROOT), **(env or {}))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull, "rb") as devnull:
        p = subprocess.Popen([sys.executable, "-m", "tuner", *args], stdin=devnull, stdout=out, stderr=err,
                             env=full_env, cwd=ROOT)
        hung = threading.Event()

        def kill() -> None:
            hung.set()
            p.kill()

        timer = threading.Timer(HANG_S, kill)
        timer.start()
        done, peak = threading.Event(), [0.0]
        sampler = threading.Thread(target=_peak_rss_mb, args=(p.pid, done, peak), daemon=True)
        sampler.start()
        try:
            _, status, _ = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
            done.set()
            sampler.join()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        ran = Ran(p.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
                  peak[0])
    if hung.is_set():
        pytest.fail(f"`{' '.join(args)}` still running after {HANG_S:.0f} s: {ran.err[-400:]}")
    return ran


@pytest.fixture
def hostile():
    made: list[HostileServer] = []

    def _make(**modes) -> HostileServer:
        s = HostileServer(**modes).start()
        made.append(s)
        return s

    yield _make
    for s in made:
        s.stop()
