"""Connections are capped (the red team's N18: 3000 half-sent requests made 3000 server threads,
each held up to 120 s): past MAX_CONNECTIONS open at once a new one gets a 503 at once and is
closed without a thread, and the server serves again as soon as the others go."""

from __future__ import annotations

import socket

import httpx

from harness import wait_until
from refengine.server.app import MAX_CONNECTIONS


def _threads(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_connections_past_the_cap_get_503_and_no_thread(server):
    host, port = server.url.removeprefix("http://").split(":")
    before = _threads(server.pid)
    held: list[socket.socket] = []
    try:
        # Half-sent requests, as a slowloris client leaves them: each holds a handler thread.
        for _ in range(MAX_CONNECTIONS + 8):
            s = socket.create_connection((host, int(port)), timeout=60)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            held.append(s)
        extra = socket.create_connection((host, int(port)), timeout=60)
        reply = extra.recv(4096)
        extra.close()
        assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
        assert _threads(server.pid) <= before + MAX_CONNECTIONS + 2
    finally:
        for s in held:
            s.close()
    wait_until(lambda: httpx.get(server.url + "/health", timeout=10).status_code == 200, 60,
               "the server to serve again once the connections closed")
