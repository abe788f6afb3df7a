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


@pytest.fixture
def serve_tp2(tp2_server):
    """The session's real TP2 server (tests/conftest.py)."""
    return tp2_server
