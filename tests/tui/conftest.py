"""Fixtures of the TUI tests: one real engine server for the session (tests that kill a server start
their own)."""

from __future__ import annotations

import pytest


@pytest.fixture
def engine(tp2_server, tp2_config):
    """The session's TP2 server (tests/conftest.py); keys change its setting, so it is put back
    after each test."""
    return tp2_server
