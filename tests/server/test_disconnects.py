"""A gone client is told by a reset or a failed write, not by EOF on the read side (the red team's
N5): a client that half-closes after sending (shutdown(SHUT_WR), as `nc -N`) gets its whole reply,
and one that closes its socket still has its request aborted and its slot freed at once."""

from __future__ import annotations

import json
import socket

import httpx

from harness import wait_until

BODY = {"text": "abc", "sampling_params": {"max_new_tokens": 64, "ignore_eos": True, "temperature": 0}}


def _send(url: str, body: dict) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)), timeout=120)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    return s


def _final_reply(data: bytes) -> tuple[int, dict]:
    """The final reply after any interim 1xx ones (which every HTTP/1.1 client skips)."""
    while data.startswith(b"HTTP/1.1 1"):
        data = data[data.index(b"\r\n\r\n") + 4:]
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_half_closed_client_gets_the_whole_reply(server):
    s = _send(server.url, BODY)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:                       # the server closes after its reply: the client sent EOF
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    status, reply = _final_reply(data)
    assert status == 200, data[:300]
    assert len(reply["output_ids"]) == 64 and reply["meta_info"]["finish_reason"]["type"] == "length", reply


def test_closed_client_is_aborted_and_its_slot_freed(server, http):
    long = {"text": "abc", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0}}
    s = _send(server.url, long)
    wait_until(lambda: http.get("/specdecode/slots").json()["running"], 60, "the request to run")
    s.close()

    def freed() -> bool:
        slots = http.get("/specdecode/slots").json()
        return not slots["running"] and not slots["in_flight"] and slots["engine_requests"] == 0

    wait_until(freed, 30, "the closed client's request to be aborted and its slot freed")
    assert httpx.get(server.url + "/health").status_code == 200
