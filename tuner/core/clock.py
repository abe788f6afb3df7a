"""Clocks the core reads time from, injected so tests and replay never sleep.

A clock only tells time; waiting is done by its user (threads wait on Events with real timeouts).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds; live clocks use epoch seconds so times line up with servers' own timestamps."""
        ...


class SystemClock:
    """The wall clock (epoch seconds). Server phase records use the same base."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told: for tests and for replay's virtual time."""

    def __init__(self, t: float = 0.0) -> None:
        self._t = float(t)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def set(self, t: float) -> None:
        with self._lock:
            self._t = float(t)

    def advance(self, dt: float) -> float:
        with self._lock:
            self._t += float(dt)
            return self._t
