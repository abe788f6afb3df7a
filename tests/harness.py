"""What every test folder shares: a free loopback port, waiting on a condition, starting a real
`serve --tp-size 2` on CPU and checking that it leaves nothing behind, and running a script under
Triton's interpreter (the GPU kernels' CPU check).

Tests wait on what they can observe (a reply, a record, a file), never on a sleep: `wait_until`
polls a predicate until it holds and fails with what it was waiting for. Must not start anything
by itself (the fixtures in tests/conftest.py do).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import httpx

from tuner.engine_process import EngineProcess

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 240.0
# The ranks get one thread each: two TP ranks on a 2-core machine must not fight over cores.
SERVE_ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
# `SPECDECODE_SERVE_ARGS` (e.g. "--device cuda") is appended to every server's flags, so the same
# real-HTTP tests run on a GPU host.
EXTRA_ARGS = shlex.split(os.environ.get("SPECDECODE_SERVE_ARGS", ""))
# The shared server (tests/conftest.py): the shipped tiny model (trained, so acceptance is real and
# text is text), TP 2, a short decode-log interval so the log line shows quickly.
TP2_ARGS = ["--tp-size", "2", "--port", "0", "--max-running-requests", "4", "--speculative-num-steps", "3",
            "--decode-log-interval", "5"]
# The shared server fails, in verify_sample on every rank, each request whose id starts with this
# (refengine.engine.FAULT_ENV): tests/server/test_decode_fault.py checks that it fails alone. No
# other test sends such an id.
FAULT_RID = "injected-fault-"
TP2_ENV = {"SPECDECODE_FAULT_DECODE_RID": FAULT_RID}
# Where a test needs the model's weights not to matter: the agreeing random-weight preset.
AGREEING_MODEL = ["--model-path", "tiny-agreeing", "--load-format", "dummy"]

T = TypeVar("T")


def free_port() -> int:
    """A loopback port nobody listens on right now (for a server that must keep its port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something truthy and return that; AssertionError naming
    `what` after `timeout` seconds. The interval only paces the polling: nothing depends on it."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def read_only_query(path, sql: str, *params) -> tuple:
    """One row of `sql` on an SQLite file another process is writing, through a read-only
    connection that is closed at once (a lingering reader would keep the writer from closing)."""
    import sqlite3
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql, params).fetchone()
    finally:
        con.close()


def start_server(args: list[str], env: dict[str, str] | None = None,
                 timeout_s: float = START_TIMEOUT_S) -> EngineProcess:
    """A ready `serve ARGS` (plus SPECDECODE_SERVE_ARGS), its group ended if this process dies."""
    return EngineProcess.start([*args, *EXTRA_ARGS], env={**SERVE_ENV, **(env or {})}, timeout_s=timeout_s,
                               cwd=ROOT, die_with_parent=True)


def start_servers(n: int, args: list[str], env: dict[str, str] | None = None,
                  timeout_s: float = START_TIMEOUT_S) -> list[EngineProcess]:
    """`n` ready `serve ARGS`, launched together from this thread and then each waited for (their
    start-up overlaps); on any failure none is left running."""
    launched: list[EngineProcess] = []
    try:
        for _ in range(n):
            launched.append(EngineProcess.launch([*args, *EXTRA_ARGS], env={**SERVE_ENV, **(env or {})},
                                                 cwd=ROOT, die_with_parent=True))
        for s in launched:
            s.wait_ready(timeout_s)
    except BaseException:
        for s in launched:
            s.kill()
        raise
    return launched


@contextmanager
def checked_server(args: list[str], env: dict[str, str] | None = None) -> Iterator[EngineProcess]:
    """A started server for a fixture. On the way out SIGTERM must end it with status 0, and the
    server must have ended its ranks itself: nothing of its group may be left for the sweep."""
    s = start_server(args, env)
    try:
        pids = rank_pids(s.url) + [s.pid]
    except BaseException:
        s.kill()
        raise
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]
    assert s.left_behind == [] and wait_gone(pids) == [], "a server or rank process outlived SIGTERM"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not a leftover worker, but it does mean nobody reaped it.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    """The pids still alive after waiting up to `timeout` for all of them to end."""
    try:
        wait_until(lambda: not any(pid_alive(p) for p in pids), timeout, "processes to end")
    except AssertionError:
        pass
    return [p for p in pids if pid_alive(p)]


def rank_pids(base: str, headers: dict | None = None) -> list[int]:
    text = httpx.get(f"{base}/metrics", headers=headers, timeout=60).text
    return [int(m) for m in re.findall(r'specdecode:rank_info\{[^}]*pid="(\d+)"', text)]


def server_config(url: str) -> dict:
    """The knobs the server runs now (internal_states[0]), to put back after a test changed them."""
    from probes.names import KNOBS
    state = httpx.get(url + "/server_info", timeout=60).json()["internal_states"][0]
    return {k: state[k] for k in KNOBS if k in state}


def restore_config(url: str, config: dict) -> None:
    r = httpx.post(url + "/set_internal_state", json={"server_args": config}, timeout=60)
    assert r.status_code == 200 and r.json() == [True], r.text


def run_under_triton_interpreter(script: str) -> str:
    """Run `script` in a child Python with TRITON_INTERPRET=1 (the interpreter is chosen when Triton
    is first imported, so never in this process); its stdout, or a failure with its stderr's tail."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout
