"""The engine launcher (tuner/engine_process.py) against real `python -m refengine serve` children:
ready line and URL, one-line start errors with the log's tail, and no process left after stop, kill,
or the death of the process that started the server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness import wait_until
from tuner.engine_process import READY_LINE, EngineProcess, EngineStartError, group_members

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
TINY = ["--model-path", "tiny-agreeing", "--load-format", "dummy", "--skip-server-warmup"]


def gone(pid: int) -> bool:
    """True once `pid` is no process, or only a zombie nobody has reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def all_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    try:
        wait_until(lambda: all(gone(p) for p in pids), timeout, "processes to end", interval=0.1)
    except AssertionError:
        pass
    return [p for p in pids if not gone(p)]


@pytest.mark.slow
def test_start_reads_the_url_and_stop_ends_every_process(tmp_path):
    log = tmp_path / "serve.log"
    engine = EngineProcess.start([*TINY, "--tp-size", "2", "--port", "0"], env=ENV, log_path=log,
                                 timeout_s=240, cwd=ROOT)
    try:
        assert engine.alive() and engine.url == f"http://127.0.0.1:{engine.port}"
        assert httpx.get(engine.url + "/health", timeout=60).status_code == 200
        members = group_members(engine.pid)
        # The server and both TP ranks share its process group (and nothing else does).
        assert engine.pid in members and len(members) >= 3, members
        assert READY_LINE in log.read_text() and READY_LINE in engine.log_text()
    finally:
        rc = engine.stop()
    assert rc == 0, engine.log_tail(40)
    assert engine.left_behind == []
    assert all_gone(members) == [] and group_members(engine.pid) == []
    assert not engine.alive()
    assert "shutting down" in engine.log_text()     # still readable after the end


def test_a_server_that_exits_gives_one_line_with_its_last_words():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(EngineStartError) as info:
            EngineProcess.start(["--port", str(port)], env=ENV, timeout_s=120, cwd=ROOT)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("the engine exited with status 2 before it was ready")
    assert f"cannot listen on 127.0.0.1:{port}" in msg          # the server's own error, from the log
    assert f"cannot listen on 127.0.0.1:{port}" in info.value.log_tail


def test_a_server_not_ready_in_time_is_stopped_and_named_in_one_line(tmp_path):
    log = tmp_path / "slow.log"
    with pytest.raises(EngineStartError) as info:
        EngineProcess.start([*TINY, "--port", "0"], env=ENV, log_path=log, timeout_s=1.0, cwd=ROOT)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("the engine was not ready within 1 s")
    assert str(log) in msg
    assert gone(info.value.pid) and group_members(info.value.pid) == []


def test_a_killed_parent_takes_the_server_and_its_ranks_along(tmp_path):
    # The demo's guarantee: a parent killed with SIGKILL (no teardown runs) still leaves nothing.
    script = ("import sys, time\n"
              "from tuner.engine_process import EngineProcess, group_members\n"
              f"e = EngineProcess.start({[*TINY, '--tp-size', '2', '--port', '0']!r}, env={ENV!r}, "
              "timeout_s=240, die_with_parent=True)\n"
              "print(' '.join(map(str, group_members(e.pid))), flush=True)\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, **ENV},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = parent.stdout.readline()
        members = [int(p) for p in line.split()]
        assert len(members) >= 3, line
    finally:
        parent.kill()
        parent.wait(30)
    left = all_gone(members, timeout=60)
    for pid in left:        # do not leave them to the next test, but fail
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_kill_ends_the_whole_group_at_once():
    engine = EngineProcess.start([*TINY, "--port", "0"], env=ENV, timeout_s=240, cwd=ROOT)
    members = group_members(engine.pid)
    assert engine.kill() == -signal.SIGKILL
    assert all_gone(members) == [] and not engine.alive()
    with pytest.raises(httpx.TransportError):
        httpx.get(engine.url + "/health", timeout=5)

