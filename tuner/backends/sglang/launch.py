"""A server process `specdecode-tune launch` owns: start, readiness wait, relaunch, stop.

The command is an argv list run without a shell, in its own session so that stopping it ends
every process it spawned (SGLang's scheduler, detokenizer and TP-rank processes). Its output goes
to a log file, whose newest line is the progress shown while waiting. Readiness is SGLang's:
`GET /health` answers 200 and `GET /model_info` answers JSON (reference §1.1, §10).

A relaunch applies settings SGLang cannot change live (tuner.backends.sglang.args) by stopping the server
and starting the rewritten command: it asks `confirm` first (or the caller asked already, through
`proposal`, as the TUI does), reports progress, marks the start and the outcome with `on_event`
(the session's bus under `launch`: the TUI's log and the recording), and records every command it
tried. If the new setting does not come up, the previous command is started again. A relaunch may
run on a worker thread; `shutdown()` from another thread ends it and nothing is started after.

Must not import textual or torch, nor build a shell string from anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import httpx

from tuner.backends.sglang.args import Launch, apply_settings, runs_already, server_url
from tuner.core.events import EventKind

READY_LINE = "The server is fired up and ready to roll!"


class LaunchError(RuntimeError):
    """The server could not be started or did not become ready (one line + the log's tail)."""


@dataclass
class Tried:
    """One command the manager ran, and how it went."""
    command: str                 # Launch.display(): shell-quoted, secrets redacted
    changes: dict[str, Any]
    outcome: str = "starting"    # starting | ready | failed: <why> | stopped
    ready_s: float | None = None


@dataclass
class ManagedServer:
    launch: Launch
    log_path: Path
    ready_timeout_s: float = 1800.0          # big models load and capture graphs for minutes
    poll_s: float = 0.5
    api_key: str | None = None
    on_event: Callable[[str, dict], None] = lambda kind, data: None
    on_progress: Callable[[str], None] = lambda text: None
    confirm: Callable[[str], bool] = lambda question: True
    tried: list[Tried] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    _log: Any = None
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return server_url(list(self.launch.argv))

    # --- process ------------------------------------------------------------------------------

    def start(self, changes: Mapping[str, Any] | None = None) -> None:
        """Start the current launch and wait until it is ready; LaunchError if it is not."""
        if self.proc is not None and self.proc.poll() is None:
            raise LaunchError("the server is already running")
        entry = Tried(self.launch.display(), dict(changes or {}))
        t0 = time.monotonic()
        # Under the lock: a shutdown from another thread either comes first (nothing starts) or
        # sees the new process and stops it.
        with self._lock:
            if self._closed:
                raise LaunchError("not started: launch is shutting down")
            self.tried.append(entry)
            self.on_progress(f"starting: {entry.command}")
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
            self._log.write(f"\n### specdecode-tune launch: {entry.command}\n".encode())
            self._log.flush()
            try:
                self.proc = subprocess.Popen(list(self.launch.argv), env={**os.environ, **self.launch.env_dict()},
                                             stdin=subprocess.DEVNULL, stdout=self._log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as e:
                entry.outcome = f"failed: {e.strerror or e}"
                self._close_log()
                raise LaunchError(f"cannot start {self.launch.argv[0]}: {e.strerror or e}") from None
        try:
            self._wait_ready(t0)
        except LaunchError as e:
            entry.outcome = f"failed: {e.args[0].splitlines()[0]}"
            self.stop(record=False)
            raise
        entry.outcome, entry.ready_s = "ready", round(time.monotonic() - t0, 3)
        self.on_progress(f"ready in {entry.ready_s:.1f} s at {self.url}")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _wait_ready(self, t0: float) -> None:
        deadline = t0 + self.ready_timeout_s
        last = ""
        with httpx.Client(timeout=5.0, headers=self._headers(), trust_env=False) as http:
            while True:
                proc = self.proc
                if proc is None:                   # stopped by a shutdown meanwhile
                    raise LaunchError("stopped before it was ready: launch is shutting down")
                if proc.poll() is not None:
                    raise LaunchError(f"the server exited with status {proc.returncode} before "
                                      f"it was ready\n{self.log_tail()}")
                if self._ready(http):
                    return
                if time.monotonic() > deadline:
                    raise LaunchError(f"the server was not ready within {self.ready_timeout_s:.0f} s"
                                      f"\n{self.log_tail()}")
                line = self.log_tail(1)
                # Our own marker line is the command already said at "starting": wait for the server's.
                if line and line != last and not line.startswith("### specdecode-tune launch:"):
                    last = line
                    self.on_progress(f"[{time.monotonic() - t0:5.0f} s] {line[-160:]}")
                time.sleep(self.poll_s)

    def _ready(self, http: httpx.Client) -> bool:
        try:
            if http.get(self.url + "/health").status_code != 200:
                return False
            r = http.get(self.url + "/model_info")
            return r.status_code == 200 and isinstance(r.json(), dict)
        except (httpx.HTTPError, ValueError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def shutdown(self, grace_s: float = 30.0) -> None:
        """Stop the server for good: a relaunch running on another thread starts nothing after."""
        with self._lock:
            self._closed = True
        self.stop(grace_s)

    def stop(self, grace_s: float = 30.0, record: bool = True) -> None:
        """End the server and everything it spawned (SIGTERM to its session, then SIGKILL)."""
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                self._signal(proc, signal.SIGTERM)
                try:
                    proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            # Children that outlived the leader (or ignored SIGTERM) go now, and are gone before
            # we return: a relaunch needs the port and the GPUs back.
            self._signal(proc, signal.SIGKILL)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            _wait_group_gone(proc.pid, 5.0)
            if record and self.tried and self.tried[-1].outcome == "ready":
                self.tried[-1].outcome = "stopped"
        self.proc = None
        self._close_log()

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])

    # --- relaunch -------------------------------------------------------------------------------

    def proposal(self, changes: Mapping[str, Any]) -> Launch | None:
        """The launch `changes` would run, None when the server runs it already; ArgsError (one
        line) for a setting SGLang would refuse. Nothing is stopped or started."""
        new = apply_settings(self.launch, changes)
        return None if new == self.launch or runs_already(self.launch, changes) else new

    @staticmethod
    def question(changes: Mapping[str, Any], new: Launch) -> str:
        """The confirmation asked before a relaunch (the CLI's prompt, the TUI's dialog)."""
        return (f"Relaunch the server to apply {_describe(changes)}? It stops serving until the "
                f"new one is ready.\n  {new.display()}")

    def relaunch(self, changes: Mapping[str, Any], *, confirmed: bool = False) -> bool:
        """Apply `changes` by restarting the server with a rewritten command.

        Returns False when the operator declined (`confirm`, unless `confirmed`: the caller
        asked already). Raises ArgsError for a setting SGLang would refuse (nothing is stopped
        then) and LaunchError when neither the new nor the previous command came up again.
        """
        new = self.proposal(changes)
        if new is None:
            self.on_progress("nothing to change: the server already runs with these settings")
            return True
        if not confirmed and not self.confirm(self.question(changes, new)):
            return False
        old = self.launch
        self.on_event(EventKind.RELAUNCH_STARTED, {"changes": dict(changes), "command": new.display(),
                                           "previous": old.display()})
        t0 = time.monotonic()
        self.on_progress("stopping the server")
        self.stop()
        self.launch = new
        try:
            self.start(changes)
        except LaunchError as e:
            self.on_event(EventKind.RELAUNCH_FAILED, {"changes": dict(changes), "command": new.display(),
                                              "error": e.args[0].splitlines()[0]})
            self.on_progress("the new setting did not come up; starting the previous command again")
            self.launch = old
            self.start({"rollback": True})
            self.on_event(EventKind.RELAUNCH_ROLLED_BACK, {"command": old.display()})
            raise LaunchError(f"relaunch with {_describe(changes)} failed and was rolled back: "
                              f"{e.args[0].splitlines()[0]}") from None
        self.on_event(EventKind.RELAUNCH_READY, {"changes": dict(changes), "command": new.display(),
                                         "seconds": round(time.monotonic() - t0, 3)})
        return True

    def report(self) -> str:
        """Every command tried, for the operator to copy (printed at exit)."""
        lines = ["Launch commands tried (most recent last):"]
        for i, t in enumerate(self.tried, 1):
            took = f", ready in {t.ready_s:.1f} s" if t.ready_s is not None else ""
            what = f" [{_describe(t.changes)}]" if t.changes else ""
            lines.append(f"  {i}. {t.outcome}{took}{what}\n     {t.command}")
        return "\n".join(lines)


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait until no live process is left in the group (orphaned zombies do not count)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _live_members(pgid):
            return
        time.sleep(0.05)


def _live_members(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return True                        # no /proc: trust killpg
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:   # state, ppid, pgrp
            return True
    return False


def _describe(changes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "the launch command"
