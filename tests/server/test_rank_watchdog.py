"""A hung rank is seen (the red team's N13: with rank 1 stopped, /health stayed 200 and twelve
requests waited for the 600-s update timeout): past the rank deadline /health is 503 with the
reason and the stalled requests fail; when the rank resumes the server serves again."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest

from harness import rank_pids, start_server, wait_until
from refengine.client import EngineStartError, rank_deadline_s


def test_deadline_from_the_environment():
    assert rank_deadline_s({}) == 120.0
    assert rank_deadline_s({"SPECDECODE_RANK_DEADLINE_S": "2.5"}) == 2.5
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(EngineStartError, match="SPECDECODE_RANK_DEADLINE_S"):
            rank_deadline_s({"SPECDECODE_RANK_DEADLINE_S": bad})


@pytest.mark.slow
def test_a_stopped_rank_turns_health_503_and_fails_its_requests():
    server = start_server(["--tp-size", "2", "--port", "0"], env={"SPECDECODE_RANK_DEADLINE_S": "3"})
    stopped = None
    try:
        base = server.url
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        stopped = rank_pids(base)[1]
        replies: list[httpx.Response] = []

        def long_request() -> None:
            replies.append(httpx.post(base + "/generate", timeout=120, json={
                "text": "abc", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}))

        t = threading.Thread(target=long_request)
        t.start()
        wait_until(lambda: httpx.get(base + "/specdecode/slots", timeout=30).json()["running"], 60, "it to run")
        os.kill(stopped, signal.SIGSTOP)
        wait_until(lambda: httpx.get(base + "/health", timeout=30).status_code == 503, 60, "/health to say 503")
        health = httpx.get(base + "/health", timeout=30)
        assert "TP rank" in health.text and "sent nothing" in health.text, health.text
        t.join(60)
        assert not t.is_alive(), "the stalled request still waits"
        assert replies[0].status_code == 503 and "sent nothing" in replies[0].text, replies[0].text[:300]
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        wait_until(lambda: httpx.get(base + "/health", timeout=30).status_code == 200, 60, "/health to recover")
        r = httpx.post(base + "/generate", timeout=120, json={"text": "abc", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 4
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        server.stop(timeout=60)
