"""Fixtures for the record/report tests: one real engine server (`serve --tp-size 2`, the shipped
tiny model, CPU) shared by every test that records."""

from __future__ import annotations

import pytest

from report_helpers import Served


@pytest.fixture(scope="session")
def engine_tp2():
    s = Served("--tp-size", "2", "--port", "0", "--max-running-requests", "4")
    s.wait_ready()
    yield s
    assert s.stop() == 0, "\n".join(s.lines[-40:])
