"""Starting real `serve` processes for the tests and checking that nothing is left behind.

`SPECDECODE_SERVE_ARGS` (e.g. "--device cuda") is appended to every server's flags, so the same
real-HTTP suite runs on a GPU host.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from tuner.engine_process import EngineProcess

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0

# No --model-path: the default, i.e. the shipped tiny model (trained, so acceptance is real and
# text is text), or the agreeing random-weight preset where the weights are not installed.
MODEL_ARGS: list[str] = []
EXTRA_ARGS = shlex.split(os.environ.get("SPECDECODE_SERVE_ARGS", ""))


def start_server(args: list[str], env: dict[str, str] | None = None) -> EngineProcess:
    """A ready `serve ARGS` (plus SPECDECODE_SERVE_ARGS). `.stop()` sends SIGTERM to the server only
    (ending its ranks is its job, which these tests check through `left_behind`)."""
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return EngineProcess.start([*args, *EXTRA_ARGS], env=env, timeout_s=START_TIMEOUT_S, cwd=ROOT,
                               die_with_parent=True)


@contextmanager
def checked_server(args: list[str]) -> Iterator[EngineProcess]:
    """A started server for a fixture. On the way out SIGTERM must end it with status 0, and the
    server must have ended its ranks itself: nothing of its group may be left for the sweep."""
    s = start_server(args)
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
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def rank_pids(base: str, headers: dict | None = None) -> list[int]:
    text = httpx.get(f"{base}/metrics", headers=headers, timeout=60).text
    return [int(m) for m in re.findall(r'specdecode:rank_info\{[^}]*pid="(\d+)"', text)]


