"""Real engine servers on loopback for the TUI tests, and a helper to wait on a running app.

The server is `python -m refengine serve --tp-size 2` on CPU (one thread per rank), as a process
group so a kill takes its ranks with it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
READY = "The server is fired up and ready to roll!"
START_TIMEOUT_S = 240.0
# The agreeing random-weight preset: acceptance is real (tau > 1) without the trained model.
MODEL_ARGS = ["--model-path", "tiny-agreeing", "--load-format", "dummy"]


def _die_with_parent() -> None:
    # A killed test run must not leave servers behind (Linux's PR_SET_PDEATHSIG).
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


class Engine:
    """One `serve` process group; `kill()` takes the ranks with it, `restart()` reuses the port."""

    def __init__(self, *args: str, port: int = 0, model_args: list[str] | None = None) -> None:
        """model_args: the model flags; None: the agreeing preset; []: serve's default (the shipped model)."""
        self.args = list(args)
        self.model_args = MODEL_ARGS if model_args is None else list(model_args)
        self.lines: list[str] = []
        self.url: str | None = None
        self.port = port
        self._start()

    def _start(self) -> None:
        self._ready = threading.Event()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "refengine", "serve", *self.model_args, "--tp-size", "2",
             "--port", str(self.port), *self.args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True, preexec_fn=_die_with_parent)
        threading.Thread(target=self._read, daemon=True).start()
        self._ready.wait(START_TIMEOUT_S)
        if self.url is None:
            self.kill()
            raise RuntimeError("server did not become ready:\n" + "\n".join(self.lines[-40:]))
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if READY in line:
                m = re.search(r"(http://[^\s/]+)", line)
                self.url = m.group(1) if m else None
                self._ready.set()
        self._ready.set()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.url = None
        self._start()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        self.kill(signal.SIGKILL)   # whatever ignored SIGTERM


async def wait_for(pilot, what: Callable[[], object], timeout: float = 60.0, step: float = 0.25, why: str = ""):
    """Let the app run (its own timer ticks) until `what()` is truthy; fail with `why` otherwise."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = what()
        if value:
            return value
        await pilot.pause(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {why or what}")
