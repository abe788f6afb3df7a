"""Starting real `serve` processes for the tests and checking that nothing is left behind.

`SPECDECODE_SERVE_ARGS` (e.g. "--device cuda") is appended to every server's flags, so the same
real-HTTP suite runs on a GPU host.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
READY = "The server is fired up and ready to roll!"
START_TIMEOUT_S = 180.0

# No --model-path: the default, i.e. the shipped tiny model (trained, so acceptance is real and
# text is text), or the agreeing random-weight preset where the weights are not installed.
MODEL_ARGS: list[str] = []
EXTRA_ARGS = shlex.split(os.environ.get("SPECDECODE_SERVE_ARGS", ""))


class ServerProc:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "refengine", "serve", *args, *EXTRA_ARGS], cwd=ROOT, env=full_env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if READY in line:
                m = re.search(r"(http://\S+)", line)
                self.url = m.group(1) if m else None
                self._ready.set()
        self._ready.set()

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        self._ready.wait(timeout)
        if self.url is None:
            self.stop()
            raise RuntimeError(f"server did not become ready:\n{self.output()[-4000:]}")
        return self.url

    def wait_exit(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.wait_exit(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


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


