"""A real `serve --tp-size 2` on loopback, started once per test session (see helpers.py)."""

from __future__ import annotations

import httpx
import pytest

from .helpers import MODEL_ARGS, checked_server


@pytest.fixture(scope="session")
def server():
    """One TP2 server for the session; short decode-log interval so the log line shows quickly."""
    with checked_server([*MODEL_ARGS, "--tp-size", "2", "--port", "0", "--decode-log-interval", "5",
                         "--max-running-requests", "2", "--speculative-num-steps", "3"]) as s:
        yield s


@pytest.fixture
def base(server) -> str:
    return server.url


@pytest.fixture
def http(base):
    with httpx.Client(base_url=base, timeout=120) as c:
        yield c
