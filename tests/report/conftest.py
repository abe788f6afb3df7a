"""Fixtures for the record/report tests: one real engine server (`serve --tp-size 2`, the shipped
tiny model, CPU) shared by every test that records."""

from __future__ import annotations

import pytest


@pytest.fixture
def engine_tp2(tp2_server, tp2_config):
    """The session's TP2 server (tests/conftest.py); recordings may change its setting, so it is
    put back after each test."""
    return tp2_server
