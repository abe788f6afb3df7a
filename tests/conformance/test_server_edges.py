"""Server edges (the reliability review's D17) on a real `serve` with an API key, over raw sockets.

Every bad input is a one-line 4xx and the server stays healthy; the key is checked before the body
is read; a non-streaming client that leaves gets its request aborted (its batch slot freed); the
listen backlog takes a connection burst; a client's reset is not a traceback in the server log.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from refengine.server.app import _HTTPServer
from tests.harness import wait_until
from tests.server.helpers import MODEL_ARGS, checked_server

KEY = "edge-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    with checked_server([*MODEL_ARGS, "--tp-size", "1", "--port", "0", "--api-key", KEY,
                         "--max-running-requests", "1"]) as s:
        yield s


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=300, headers=AUTH) as c:
        yield c


def addr(server) -> tuple[str, int]:
    u = urlsplit(server.url)
    return u.hostname, u.port


def raw(server, head: bytes, body: bytes = b"", timeout: float = 60.0) -> bytes:
    """Send bytes, read the reply until the server closes or one Content-Length body is in."""
    with socket.create_connection(addr(server), timeout=timeout) as s:
        s.sendall(head + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
            if b"\r\n\r\n" in data:
                header, rest = data.split(b"\r\n\r\n", 1)
                m = re.search(rb"(?i)content-length: *(\d+)", header)
                if m and len(rest) >= int(m.group(1)):
                    return data


def status_and_json(reply: bytes) -> tuple[int, dict]:
    header, body = reply.split(b"\r\n\r\n", 1)
    return int(header.split()[1]), json.loads(body)


def healthy(http) -> bool:
    r = http.post("/generate", json={"text": "ok", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    return r.status_code == 200 and http.get("/health").status_code == 200


@pytest.mark.slow
def test_deeply_nested_json_is_400(http):
    r = http.post("/set_internal_state", content=b"[" * 100_000 + b"]" * 100_000,
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "nested deeper than" in r.json()["error"]["message"], r.text
    r = http.post("/v1/chat/completions", content=b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "nested deeper than" in r.json()["message"], r.text
    assert healthy(http)


@pytest.mark.slow
@pytest.mark.parametrize("path, body, field", [
    ("/generate", b'{"text": "a\\ud800b", "sampling_params": {"max_new_tokens": 2}}', "text"),
    ("/v1/completions", b'{"prompt": "\\udfff", "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x\\ud83d"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/generate", b'{"text": "a", "sampling_params": {"stop": ["\\ud800"]}}', "sampling_params.stop[0]"),
])
def test_lone_surrogate_is_400_naming_the_field(http, path, body, field):
    r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    msg = r.json()["message"] if path.startswith("/v1/") else r.json()["error"]["message"]
    assert msg == f"{field}: a lone UTF-16 surrogate (\\ud800-\\udfff) is not valid text"
    assert healthy(http)


@pytest.mark.slow
def test_negative_content_length_is_400_saying_so(server, http):
    head = (f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Length: -5\r\n\r\n").encode()
    status, body = status_and_json(raw(server, head))
    assert status == 400 and body["error"]["message"] == "bad Content-Length: -5 is negative"
    assert healthy(http)


@pytest.mark.slow
def test_api_key_checked_before_the_body_is_read(server, http):
    """A client without the key announces 16 MB and sends none of it: the 401 comes at once (the
    server does not wait for, or buffer, a body it would refuse)."""
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 16000000\r\n\r\n"
    status, body = status_and_json(raw(server, head, timeout=60))
    assert status == 401 and body == {"error": "Unauthorized"}
    assert healthy(http)


def metric(http, name: str, **labels: str) -> float:
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(cond, timeout: float = 120.0) -> bool:
    return bool(wait_until(cond, timeout, "the server's metrics to show it"))


@pytest.mark.slow
@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1000, "temperature": 0, "ignore_eos": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 980,
                              "temperature": 0, "ignore_eos": True}),
])
def test_unstreamed_client_that_leaves_is_aborted(server, http, path, body):
    """The request finishes as aborted long before its 1000 tokens (recorded in the counters), and
    the only batch slot (--max-running-requests 1) is free for the next request."""
    done0 = metric(http, "sglang:num_requests_total", is_streaming="false")
    tokens0 = metric(http, "sglang:generation_tokens_total", is_streaming="false")
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    s = socket.create_connection(addr(server), timeout=60)
    s.sendall(head + data)
    assert wait_for(lambda: metric(http, "sglang:generation_tokens_total") > 0
                    and metric(http, "sglang:num_running_reqs") >= 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    assert wait_for(lambda: metric(http, "sglang:num_requests_total", is_streaming="false") == done0 + 1)
    assert metric(http, "sglang:generation_tokens_total", is_streaming="false") - tokens0 < 900
    assert wait_for(lambda: metric(http, "sglang:num_running_reqs") == 0)
    assert healthy(http)


@pytest.mark.slow
def test_listen_backlog(server):
    """The stdlib's backlog of 5 stalls connection bursts for a SYN retry; the server listens with 1024."""
    assert _HTTPServer.request_queue_size >= 1024
    out = subprocess.run(["ss", "-ltnH", f"sport = :{addr(server)[1]}"], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip(f"ss cannot list the socket: {out.stderr.strip()}")
    assert int(out.stdout.split()[2]) >= 1024  # Send-Q of a listening socket is its backlog


def test_connection_errors_are_not_tracebacks(capfd):
    """socketserver prints a traceback for any exception in a handler; a client's reset is not a
    server fault, so it is not one. Other errors still are."""
    httpd = _HTTPServer(("127.0.0.1", 0), object, socket.AF_INET)
    try:
        for exc in (ConnectionResetError(104, "Connection reset by peer"), BrokenPipeError(32, "Broken pipe"),
                    TimeoutError("timed out")):
            try:
                raise exc
            except OSError:
                httpd.handle_error(None, ("127.0.0.1", 1))
        assert capfd.readouterr().err == ""
        try:
            raise ValueError("a real bug")
        except ValueError:
            httpd.handle_error(None, ("127.0.0.1", 1))
        assert "Traceback" in capfd.readouterr().err
    finally:
        httpd.server_close()


@pytest.mark.slow
def test_reset_mid_body_leaves_no_traceback_in_the_log(server, http):
    """A client that resets while the server reads its body: nothing in the log, server healthy."""
    before = server.log_text()
    for _ in range(3):
        s = socket.create_connection(addr(server), timeout=60)
        s.sendall(f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  "Content-Length: 100\r\n\r\n{".encode())
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    assert healthy(http)
    new = server.log_text()[len(before):]
    assert "Traceback" not in new and "ConnectionResetError" not in new, new
