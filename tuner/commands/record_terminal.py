"""`record`'s side of the terminal: one progress line on stderr (rewritten in place on a terminal,
printed every so often otherwise), the events an operator away from the screen must know (in
tuner.core.event_text's words), and SIGINT/SIGTERM, which end the recording cleanly.

Used by tuner.commands.record alone. Must not import textual or reach into the store for anything
but the progress line.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from tuner.core.driver import Driver
from tuner.core.event_text import event_text
from tuner.core.events import EventKind as K
from tuner.core.records import Event
from tuner.core.setting import pairs as setting_pairs
from tuner.core.text import terminal_safe


class Progress:
    """One line on stderr: rewritten in place on a terminal, printed every `every_s` otherwise."""

    def __init__(self, stream: TextIO, every_s: float = 10.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.every_s = 0.5 if self.tty else every_s
        self._monotonic = monotonic
        self._last = -math.inf
        self._shown = False

    def update(self, line: str, force: bool = False) -> None:
        now = self._monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        line = terminal_safe(line)          # server strings (setting values, errors) are data
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self._shown = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, line: str) -> None:
        """A message of its own line (an event worth a line: a capture, a disconnect)."""
        if self.tty and self._shown:
            self.stream.write("\r\x1b[2K")
            self._shown = False
        self.stream.write(terminal_safe(line) + "\n")
        self.stream.flush()
        self._last = -math.inf if self.tty else self._last

    def end(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False


def hms(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


def file_size(path: Path) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.path.getsize(str(path) + suffix)
        except OSError:
            pass
    return total


def mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


SAID = frozenset({K.DISCONNECTED, K.DEGRADED, K.CONFIG_CHANGED, K.CONFIG_REFUSED, K.TRACE_CAPTURED, K.NOTE})


def worth_a_line(e: Event) -> bool:
    """The events `record` says on a line of their own: the server going and coming back, a slow
    server, the setting moving or refused, captures and notes (a failed capture or change)."""
    if e.kind == K.CONNECTED:      # the first connection is the "recording ..." line already
        return e.data.get("was") == "degraded" or float(e.data.get("after_s") or 0) > 0
    return e.kind in SAID


def say_event(progress: Progress) -> Callable[[Event], None]:
    def say(e: Event) -> None:
        said = event_text(e.kind, e.data) if worth_a_line(e) else None
        if said is not None:
            progress.say(said.text)
    return say


def status_line(driver: Driver, path: Path, duration_s: float | None) -> str:
    from tuner.core import series as S

    session = driver.session
    st = session.store
    dur = f" / {hms(duration_s)}" if duration_s else ""
    tok = st.value(S.LOAD_TOK_PER_S) if st.latest(S.LOAD_TOK_PER_S) else st.value(S.SERVER_TOK_PER_S)
    acc = st.value(S.SPEC_ACCEPT_LEN)
    written = getattr(session.recorder, "written", driver.moved)
    conn = session.connection().text()
    parts = [f"recording {hms(driver.elapsed())}{dur}", f"{written} records", mb(file_size(path)),
             "tok/s " + ("n/a" if math.isnan(tok) else f"{tok:.1f}"),
             "accept " + ("n/a" if math.isnan(acc) else f"{acc:.2f}"),
             _setting(session.active_config()), f"traces {driver.captures}", conn]
    return " · ".join(p for p in parts if p)


def _setting(active: Any) -> str:
    return setting_pairs(active)


class Stopper:
    """SIGINT/SIGTERM set an Event (the loop ends at its next tick); the old handlers come back after."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Stopper":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt   # a second Ctrl-C: the operator means it
        self.stop.set()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
