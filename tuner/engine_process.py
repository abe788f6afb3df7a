"""One running `python -m refengine serve` child: start it, wait for its ready line, stop all of it.

Used by `specdecode-tune demo`, the tests and the benchmarks alike, so there is one way to run the
reference engine as a child:

    with EngineProcess.start(["--tp-size", "2", "--port", "0"], timeout_s=180) as engine:
        httpx.get(engine.url + "/server_info")

(`launch` then `wait_ready` is the same in two steps, for starting several servers side by side.)

- The child gets its own session, so its process group is the server plus every process it
  spawned (TP ranks, multiprocessing's resource tracker); `stop()` and `kill()` end all of it.
- Optionally (`die_with_parent`, Linux) the server gets SIGTERM when the thread that started it
  dies, however it dies, so a killed parent never leaves an engine behind.
- The child's stdout and stderr go to a file (`log_path`, or an anonymous temporary file), never a
  pipe, so a chatty server cannot block on a full pipe however long nobody reads; the ready line is
  found by reading that file, and `log_text()` stays readable after the server ended.
- Failing to start (the server exits, or is not ready in time) raises `EngineStartError`, whose
  message is one line ending with the log's last lines; the process group is gone by then.

Must not import torch, refengine or textual (tuner's import rules): the engine is only a command.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

READY_LINE = "The server is fired up and ready to roll!"
_READY_URL = re.compile(re.escape(READY_LINE) + r" Serving at (http://\S+)")
_POLL_S = 0.1


class EngineStartError(RuntimeError):
    """The engine exited or was not ready in time. str() is one line; `log_tail` has more lines."""

    def __init__(self, message: str, log_tail: str, pid: int) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.pid = pid          # the server's, for checking that nothing of it is left


def serve_command(args: Sequence[str], python: str | None = None) -> list[str]:
    """The argv that starts the engine's HTTP server with `args` (no shell is ever involved)."""
    return [python or sys.executable, "-m", "refengine", "serve", *args]


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child when its parent thread dies (PR_SET_PDEATHSIG).

    prctl is looked up here, in the parent: between fork and exec the child may only call what is
    already loaded (another thread could hold the import lock)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(1, signal.SIGTERM)        # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:      # the parent died before the request took effect
            os._exit(1)

    return hook


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`, read from /proc; [] elsewhere."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields[0] = state, [2] = pgrp, [3] = session
        if fields[0] != b"Z" and int(fields[2]) == pgid and int(fields[3]) == pgid:
            found.append(int(name))
    return sorted(found)


class EngineProcess:
    """A started, ready engine server and its process group. Build one with `EngineProcess.start`."""

    def __init__(self, proc: subprocess.Popen, log_file, log_path: Path | None, command: list[str]) -> None:
        self.proc = proc
        self.command = command
        self.log_path = log_path
        self._log = log_file            # kept open: log_text() reads it after the server ended
        self._scanned = 0               # bytes of the log already searched for the ready line
        self._partial = b""
        self.url: str | None = None
        # Processes of the group still alive a grace period after the server exited (then killed).
        self.left_behind: list[int] = []

    # -- starting ---------------------------------------------------------------------------------

    @classmethod
    def start(cls, args: Sequence[str], env: Mapping[str, str] | None = None, log_path: str | Path | None = None,
              timeout_s: float = 180.0, *, cwd: str | Path | None = None, die_with_parent: bool = False,
              python: str | None = None) -> "EngineProcess":
        """Start `python -m refengine serve ARGS` and return once its ready line names the URL.

        env: variables added to (or replacing) this process's environment. log_path: where the
        server's output goes (truncated); None keeps it in an anonymous temporary file.
        die_with_parent: SIGTERM the server when the calling thread dies (so call it from a thread
        that lives as long as the server should, normally the main one). Raises EngineStartError.
        """
        engine = cls.launch(args, env, log_path, cwd=cwd, die_with_parent=die_with_parent, python=python)
        engine.wait_ready(timeout_s)
        return engine

    @classmethod
    def launch(cls, args: Sequence[str], env: Mapping[str, str] | None = None, log_path: str | Path | None = None,
               *, cwd: str | Path | None = None, die_with_parent: bool = False,
               python: str | None = None) -> "EngineProcess":
        """Start the server and return at once, before it is ready (`url` is None until
        wait_ready()): several servers launched one after another, then each waited for, start side
        by side while every one still dies with the thread that launched it."""
        command = serve_command(args, python)
        if log_path is None:
            log_file = tempfile.TemporaryFile(prefix="refengine-serve-", suffix=".log", buffering=0)
        else:
            log_path = Path(log_path)
            log_file = open(os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644),
                            "r+b", buffering=0)
        try:
            proc = subprocess.Popen(
                command, cwd=cwd, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT,
                # A new session: one killpg reaches the ranks, and a Ctrl-C meant for the parent's
                # terminal does not reach them behind its back.
                start_new_session=True, preexec_fn=_die_with_parent_hook() if die_with_parent else None)
        except BaseException:
            log_file.close()
            raise
        return cls(proc, log_file, log_path, command)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Return once the ready line names the URL. Raises EngineStartError when the server exits
        or is not ready within `timeout_s`; the server's group is gone by then (also when the
        caller is interrupted while waiting)."""
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop(timeout=10.0, grace_s=5.0)
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        if self.url is not None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            exited = self.proc.poll() is not None     # checked before reading, so no line is missed
            if (url := self._scan_for_ready()) is not None:
                self.url = url
                return
            if exited:
                raise self._start_error(f"the engine exited with status {self.proc.returncode} before it was ready")
            if time.monotonic() >= deadline:
                raise self._start_error(f"the engine was not ready within {timeout_s:.0f} s")
            time.sleep(_POLL_S)

    def _scan_for_ready(self) -> str | None:
        new = os.pread(self._log.fileno(), 1 << 20, self._scanned)
        while new:
            self._scanned += len(new)
            *lines, self._partial = (self._partial + new).split(b"\n")
            for line in lines:
                if m := _READY_URL.search(line.decode(errors="replace")):
                    return m.group(1)
            new = os.pread(self._log.fileno(), 1 << 20, self._scanned)
        return None

    def _start_error(self, what: str) -> EngineStartError:
        tail = self.log_tail(40)
        last = [line.strip() for line in tail.splitlines() if line.strip()][-3:]
        where = f" (log: {self.log_path})" if self.log_path else ""
        ends = " | ".join(last) if last else "(no output)"
        return EngineStartError(f"{what}{where}; its output ends: {ends}", tail, self.pid)

    # -- what it is -------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        assert self.url is not None
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        """Everything the server (and its ranks) printed so far."""
        if self._log.closed:
            return ""
        chunks, offset = [], 0
        while chunk := os.pread(self._log.fileno(), 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode(errors="replace")

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- ending -----------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> int:
        """The server's exit status once it exits by itself; raises subprocess.TimeoutExpired."""
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> int:
        """Send `sig` to the server (not its ranks: shutting them down is the server's job), wait up
        to `timeout` for it to exit, then up to `grace_s` for the rest of its group; whatever is still
        there is recorded in `left_behind` and killed. Returns the server's exit status."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._sweep(grace_s)
        return self.proc.wait()

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int:
        """Send `sig` to the whole process group at once (a crash, as far as clients can tell),
        then make sure nothing of it remains. Returns the server's exit status."""
        self._killpg(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self._sweep(0.0 if sig == signal.SIGKILL else 5.0)
        return self.proc.wait()

    def _sweep(self, grace_s: float) -> None:
        if self.proc.poll() is None:
            self._killpg(signal.SIGKILL)
            self.proc.wait()
        end = time.monotonic() + grace_s
        members = group_members(self.pid)
        while members and time.monotonic() < end:
            time.sleep(_POLL_S)
            members = group_members(self.pid)
        self.left_behind = members
        if members:
            self._killpg(signal.SIGKILL)

    def _killpg(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EngineProcess(pid={self.pid}, url={self.url!r}, alive={self.alive()})"
