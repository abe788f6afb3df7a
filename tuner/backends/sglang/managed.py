"""Managed mode's glue between the owned server and a Session: the relauncher the TUI calls, and
the server's log as a source of readings.

`ManagedRelaunch` implements tuner.core.relaunch.Relauncher over a `ManagedServer`: its relaunch
events go on the session's bus (so the TUI's log and a recording carry them), its progress lines
go to whoever relaunches (the TUI's progress bar) or, outside a relaunch, to `fallback`.
`LogFeed` follows the server's log file (tuner.backends.sglang.log.LogTail) on a daemon thread and
puts SGLang's decode lines and adaptive tier moves on the bus as `log/*` samples and
`adaptive_tier` events; the file outlives relaunches (each start appends), so one feed serves them all.

Must not import textual or torch, nor print while a face owns the terminal.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from tuner.backends.sglang.args import ArgsError
from tuner.backends.sglang.launch import LaunchError, ManagedServer
from tuner.backends.sglang.log import LogTail, log_samples
from tuner.core.events import EventKind
from tuner.core.records import Event

LOG_POLL_S = 0.5
MAX_LOG_ERRORS = 5
"""Broken decode lines said as poll errors before the feed stops saying them (each says its line)."""


class ManagedRelaunch:
    """The relauncher the TUI gets under `launch`: one ManagedServer, one session's bus.

    Args:
        server: the managed server (started by the caller).
        put: where events go (the session's `put`; thread-safe).
        now: the session's clock.
        fallback: where progress lines go outside a relaunch (None: dropped).
    """

    def __init__(self, server: ManagedServer, put: Callable[[Any], None], now: Callable[[], float],
                 fallback: Callable[[str], None] | None = None) -> None:
        self.server = server
        self._put, self._now = put, now
        self._fallback = fallback
        self._progress: Callable[[str], None] | None = None
        server.on_event = self._event
        server.on_progress = self._say

    def _event(self, kind: str, data: dict) -> None:
        self._put(Event(self._now(), kind, data))

    def _say(self, text: str) -> None:
        sink = self._progress or self._fallback
        if sink is not None:
            sink(text)

    def proposal(self, changes: Mapping[str, Any]) -> tuple[str, str] | None:
        try:
            new = self.server.proposal(changes)
        except ArgsError as e:
            raise ValueError(str(e)) from None
        return None if new is None else (self.server.question(changes, new), new.display())

    def relaunch(self, changes: Mapping[str, Any], progress: Callable[[str], None]) -> None:
        self._progress = progress
        try:
            self.server.relaunch(changes, confirmed=True)
        except (ArgsError, LaunchError) as e:
            raise RuntimeError(str(e).splitlines()[0]) from None
        finally:
            self._progress = None


class LogFeed:
    """The server's log → the bus, every `poll_s` on a daemon thread, until `stop()`.

    Starts at the file's end: what came before (startup lines, an earlier run in a reused --log
    file) is not this session's.
    """

    def __init__(self, path: Path, put: Callable[[Any], None], now: Callable[[], float], *,
                 poll_s: float = LOG_POLL_S) -> None:
        self.tail = LogTail(path, from_end=True)
        self._put, self._now = put, now
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said = 0

    def start(self) -> "LogFeed":
        self._thread = threading.Thread(target=self._run, name="managed-log", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.poll()                      # what the server wrote last

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> int:
        """Read what the server wrote since the last poll onto the bus; returns the records put."""
        decodes, tiers = self.tail.poll_all()
        records: list[Any] = log_samples(decodes, tiers)
        records += [Event(x.t, EventKind.ADAPTIVE_TIER, {"old_steps": x.old_steps, "new_steps": x.new_steps,
                                                         "ema_accept_len": x.ema_accept_len})
                    for x in tiers if x.kind == "policy" and x.dp == 0]
        while self._said < min(len(self.tail.errors), MAX_LOG_ERRORS):
            records.append(Event(self._now(), EventKind.POLL_ERROR,
                                 {"endpoint": "server log", "error": self.tail.errors[self._said]}))
            self._said += 1
        for r in sorted(records, key=lambda r: r.t):
            self._put(r)
        return len(records)
