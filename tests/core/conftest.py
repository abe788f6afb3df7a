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

from pathlib import Path

from tuner.engine_process import EngineProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def serve_tp2():
    """One TP2 reference-engine server on CPU for every test that needs the real thing."""
    s = EngineProcess.start(["--model-path", "tiny-agreeing", "--load-format", "dummy", "--tp-size", "2",
                             "--port", "0", "--max-running-requests", "4", "--speculative-num-steps", "3"],
                            env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout_s=240.0, cwd=ROOT,
                            die_with_parent=True)
    yield s
    assert s.stop(timeout=60.0) == 0, s.log_tail(40)
