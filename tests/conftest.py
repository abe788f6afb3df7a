"""Fixtures for the whole suite: one real CPU `serve --tp-size 2` for the session (tests/harness.py).

The server is shared by every test that neither kills it nor restarts it. A test that changes its
setting takes `tp2_config`, which puts the setting back when the test ends (pass or fail); a test
that kills or restarts a server starts its own (harness.start_server).
"""

from __future__ import annotations

import pytest

from harness import TP2_ARGS, TP2_ENV, checked_server, restore_config, server_config


@pytest.fixture(scope="session")
def tp2_server():
    """The session's TP2 server (the shipped tiny model on CPU); SIGTERM at the end must leave
    nothing behind."""
    with checked_server(TP2_ARGS, TP2_ENV) as s:
        yield s


@pytest.fixture
def tp2_config(tp2_server):
    """For a test that changes the shared server's setting: puts it back in a finaliser."""
    before = server_config(tp2_server.url)
    yield before
    restore_config(tp2_server.url, before)
