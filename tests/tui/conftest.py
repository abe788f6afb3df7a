"""Fixtures of the TUI tests: one real engine server for the session (tests that kill a server start
their own)."""

from __future__ import annotations

import pytest

from .helpers import Engine


@pytest.fixture(scope="session")
def engine():
    e = Engine("--speculative-num-steps", "3", "--max-running-requests", "4")
    yield e
    e.stop()
