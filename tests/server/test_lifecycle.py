"""Starting and stopping `serve`: refusals before start, API key, signals, and a dead rank."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest

from refengine.server import main
from .helpers import MODEL_ARGS, ROOT, rank_pids, start_server, wait_gone


def test_refuses_non_loopback_without_key(capsys):
    assert main(["--host", "0.0.0.0"]) == 2
    assert "without --api-key" in capsys.readouterr().err


def test_refuses_busy_port(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_cli_entry_point_prints_usage():
    out = subprocess.run([sys.executable, "-m", "tuner", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.returncode == 0 and "--speculative-draft-placement" in out.stdout


@pytest.mark.slow
def test_api_key_and_sigint_shutdown():
    s = start_server([*MODEL_ARGS, "--port", "0", "--api-key", "sekret", "--skip-server-warmup"])
    # A loaded 2-core CI machine can take seconds for a first forward: generous timeouts.
    c = httpx.Client(timeout=120)
    try:
        base = s.url
        auth = {"Authorization": "Bearer sekret"}
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        assert c.post(f"{base}/generate", json=body).status_code == 401
        assert c.post(f"{base}/generate", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.post(f"{base}/generate", json=body, headers=auth).status_code == 200
        assert c.post(f"{base}/set_internal_state", json={"server_args": {"speculative_num_steps": 1}}
                          ).status_code == 401
        assert c.get(f"{base}/server_info").status_code == 401
        info = c.get(f"{base}/server_info", headers=auth).json()
        assert "sekret" not in str(info)
        assert c.get(f"{base}/health").status_code == 200
        pids = rank_pids(base)
        assert len(pids) == 1
    finally:
        c.close()
        rc = s.stop(sig=signal.SIGINT)
    assert rc == 0, s.log_text()[-2000:]
    assert s.left_behind == [] and wait_gone(pids) == []
    assert "shutting down" in s.log_text()
    assert "sekret" not in s.log_text()


@pytest.mark.slow
def test_killed_rank_ends_server_with_message():
    s = start_server([*MODEL_ARGS, "--tp-size", "2", "--port", "0", "--skip-server-warmup"])
    base = s.url
    pids = rank_pids(base)
    assert len(pids) == 2
    events: list = []

    def stream() -> None:
        with httpx.Client(base_url=base, timeout=120) as c:
            with c.stream("POST", "/generate", json={"input_ids": [1, 2, 3], "stream": True, "sampling_params": {
                    "max_new_tokens": 900, "temperature": 0, "ignore_eos": True}}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
                        if len(events) == 2:
                            os.kill(pids[1], signal.SIGKILL)  # mid-stream

    t = threading.Thread(target=stream)
    try:
        t.start()
        rc = s.wait(timeout=90)
        t.join(30)
    finally:
        s.stop()
    assert rc != 0
    assert re.search(r"the engine died \(TP rank 1 \(pid \d+\) died", s.log_text()), s.log_text()[-2000:]
    assert s.left_behind == [] and wait_gone(pids) == []
    # The client in flight is told why, SGLang-style, instead of being left hanging.
    assert events and events[-1] == "[DONE]", events[-3:]
    err = json.loads(events[-2])["error"]
    assert "died" in err["message"] and err["code"] == 503


@pytest.mark.slow
def test_sigterm_during_stream_leaves_no_process():
    s = start_server([*MODEL_ARGS, "--tp-size", "2", "--port", "0", "--skip-server-warmup"])
    base = s.url
    pids = rank_pids(base) + [s.pid]
    with httpx.Client(base_url=base, timeout=60) as c:
        with c.stream("POST", "/generate", json={"input_ids": [1, 2, 3], "stream": True, "sampling_params": {
                "max_new_tokens": 500, "temperature": 0, "ignore_eos": True}}) as r:
            next(r.iter_bytes())
            rc = s.stop(sig=signal.SIGTERM)
    assert rc == 0, s.log_text()[-2000:]
    assert s.left_behind == [] and wait_gone(pids) == []
