"""The server tests use the session's real `serve --tp-size 2` on loopback (tests/conftest.py)."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture
def server(tp2_server):
    return tp2_server


@pytest.fixture
def base(server) -> str:
    return server.url


@pytest.fixture
def http(base):
    with httpx.Client(base_url=base, timeout=120) as c:
        yield c
