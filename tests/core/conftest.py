"""Fixtures for the headless core's tests: a stand-in HTTP server (see core_standin.py) and a
session on a manual clock wired to a backend without its poller threads."""

from __future__ import annotations

import pytest

from core_standin import StandIn
from tuner.core.clock import ManualClock
from tuner.core.session import Session


@pytest.fixture
def standin():
    s = StandIn().start()
    yield s
    s.stop()


def wired(backend, t0: float = 1000.0):
    """A Session on a ManualClock whose backend is attached (no threads: tests call poll_* by hand)."""
    clock = ManualClock(t0)
    session = Session(backend, clock=clock)
    backend.attach(session.bus, clock)
    return session, clock


@pytest.fixture
def wire():
    made = []

    def _wire(backend, t0: float = 1000.0):
        made.append(backend)
        return wired(backend, t0)

    yield _wire
    for b in made:
        b.stop()


# -- a real `specdecode-tune serve --tp-size 2` on CPU, one per test session ------------------------

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READY = "The server is fired up and ready to roll!"


class Served:
    """`python -m refengine serve` as a child process; its URL is read from the ready line."""

    def __init__(self, args: list[str]) -> None:
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "refengine", "serve", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if READY in line:
                m = re.search(r"(http://\S+)", line)
                self.url = m.group(1) if m else None
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 240.0) -> str:
        self._ready.wait(timeout)
        if self.url is None:
            self.stop()
            raise RuntimeError("serve did not become ready:\n" + "\n".join(self.lines[-40:]))
        return self.url

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@pytest.fixture(scope="session")
def serve_tp2():
    """One TP2 reference-engine server on CPU for every test that needs the real thing."""
    s = Served(["--model-path", "tiny-agreeing", "--load-format", "dummy", "--tp-size", "2", "--port", "0",
                "--max-running-requests", "4", "--speculative-num-steps", "3"])
    s.wait_ready()
    yield s
    assert s.stop() == 0, "\n".join(s.lines[-40:])
