"""Starting real `serve` processes for the tests and checking that nothing is left behind.

`SPECDECODE_SERVE_ARGS` (e.g. "--device cuda") is appended to every server's flags, so the same
real-HTTP suite runs on a GPU host.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path

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


