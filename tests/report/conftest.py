"""Fixtures for the record/report tests: one real engine server (`serve --tp-size 2`, the shipped
tiny model, CPU) shared by every test that records."""

from __future__ import annotations

import pytest

from report_helpers import start_engine


@pytest.fixture(scope="session")
def engine_tp2():
    s = start_engine("--tp-size", "2", "--port", "0", "--max-running-requests", "4")
    yield s
    assert s.stop(timeout=60.0) == 0, s.log_tail(40)
