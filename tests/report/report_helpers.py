"""Helpers for the record/report tests: a real `python -m refengine serve` child (the shipped tiny
model, TP 2 on CPU), a free port, and the `record` command as a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from harness import free_port, start_server, wait_until  # noqa: F401  (free_port: for the tests)
from tuner.engine_process import EngineProcess

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def start_engine(*args: str, timeout_s: float = 300.0) -> EngineProcess:
    """`python -m refengine serve ARGS`, ready; `.stop(timeout=60.0)` ends it and its ranks."""
    return start_server(list(args), timeout_s=timeout_s)


class Recording:
    """`python -m tuner record URL --out FILE ARGS` as a child; stderr kept line by line."""

    def __init__(self, url: str, out: Path, *args: str) -> None:
        self.err: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "tuner", "record", url, "--out", str(out), *args],
                                     cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._started = threading.Event()
        self._drained = threading.Event()   # stderr reached its end: the process said all it will
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))
            if line.startswith("recording "):
                self._started.set()
        self._started.set()
        self._drained.set()

    def wait_started(self, timeout: float = 60.0) -> None:
        assert self._started.wait(timeout), "record printed nothing"
        assert self.proc.poll() is None, "record ended early:\n" + "\n".join(self.err)

    def wait_for_line(self, text: str, timeout: float = 60.0) -> bool:
        """Whether `text` appears on stderr within `timeout`; an ended process has said all it will
        once its stderr is drained."""
        try:
            wait_until(lambda: any(text in line for line in self.err) or self._drained.is_set(), timeout,
                       f"{text!r} on record's stderr")
        except AssertionError:
            return False
        return any(text in line for line in self.err)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def stderr(self) -> str:
        return "\n".join(self.err)
