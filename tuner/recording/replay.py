"""The replay backend: a recording fed into the same bus on a virtual clock, with seek, pause, speed.

Replay is just another backend, so every view works on recordings and tests replay committed files.
It produces on the session's own thread: Session.tick() calls pump(), which moves the virtual clock
(real elapsed time x speed while playing) and releases the records whose time has come, in the
order they were recorded. Nothing here sleeps; step(dt) advances by hand. It is read-only.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from tuner.backends.base import Backend, Capabilities, ConnectionState
from tuner.core.bus import Bus
from tuner.core.clock import Clock, ManualClock
from tuner.core.records import Record
from tuner.recording.reader import RecordingReader, open_recording

HISTORY_S = 600.0     # what a seek loads before its target, so charts and A/B have their past


class ReplayBackend(Backend):
    """Args:
        path: the recording.
        speed: virtual seconds per real second while playing.
        paused: start paused (the TUI's snapshot tests do, then seek/step).
        history_s: how much before a seek target is loaded (all events are always loaded).
        monotonic: the real clock pacing play (injected in tests).
        server: one member of a fleet recording (its records and header only).
    """

    kind = "replay"
    can_seek = True

    def __init__(self, path: str | Path, *, speed: float = 1.0, paused: bool = False, history_s: float = HISTORY_S,
                 monotonic: Callable[[], float] = time.monotonic, server: str | None = None) -> None:
        self.reader: RecordingReader = open_recording(path, server)
        self.path = Path(path)
        self.header = self.reader.header
        self.start_t = self.reader.t_first if math.isfinite(self.reader.t_first) else 0.0
        self.end_t = self.reader.t_last if math.isfinite(self.reader.t_last) else self.start_t
        self.clock = ManualClock(self.start_t)
        self.speed = float(speed)
        self.paused = paused
        self.ended = False
        self.history_s = history_s
        self._monotonic = monotonic
        self._last_real: float | None = None
        self._bus: Bus | None = None
        self._iter: Iterator[tuple[int, Record]] | None = None
        self._ahead: tuple[int, Record] | None = None

    # -- what it is -------------------------------------------------------------------------------

    @property
    def length_s(self) -> float:
        return self.end_t - self.start_t

    @property
    def position(self) -> float:
        return self.clock.now()

    @property
    def problem(self) -> str | None:
        return self.reader.problem

    @property
    def info(self) -> dict[str, Any]:
        return dict(self.header.get("server_info") or {})

    @property
    def capabilities(self) -> Capabilities:
        recorded = self.header.get("capabilities") or {}
        names = self.reader.series_names()
        return Capabilities(
            HAS_PHASE_TIMERS=bool(recorded.get("HAS_PHASE_TIMERS", any(n.startswith("phase/") for n in names))),
            HAS_PHASE_STREAM=bool(recorded.get("HAS_PHASE_STREAM", False)),
            LOCAL_GPUS=False, READ_ONLY=True,
        )

    @property
    def connection(self) -> ConnectionState:
        return ConnectionState(True, self.start_t)

    # -- life cycle -------------------------------------------------------------------------------

    def start(self, bus: Bus, clock: Clock) -> None:
        self._bus = bus
        self._restart_from(-1)
        self._release()

    def stop(self) -> None:
        self._iter = None
        self.reader.close()

    # -- playing ----------------------------------------------------------------------------------

    def play(self) -> None:
        if self.ended:
            self.seek(self.start_t)
        self.paused = False
        self._last_real = None

    def pause(self) -> None:
        self.paused = True

    def set_speed(self, speed: float) -> None:
        self.speed = max(0.01, float(speed))

    def pump(self) -> int:
        """Advance the virtual clock by real elapsed time x speed (when playing) and release records."""
        real = self._monotonic()
        if not self.paused and self._last_real is not None:
            self._advance((real - self._last_real) * self.speed)
        self._last_real = real
        return self._release()

    def step(self, dt: float) -> int:
        """Advance the virtual clock by dt seconds, playing or paused, and release records."""
        self._advance(dt)
        return self._release()

    def seek(self, t: float) -> None:
        """Jump to time t. The caller (Session.seek) clears the store first; this refills it with
        every event and trace before t and all records of the last history_s before t."""
        t = min(max(t, self.start_t), self.end_t)
        self.clock.set(t)
        self.ended = False
        start_seq = self.reader.seq_at(t - self.history_s)
        if self._bus is not None and start_seq >= 0:
            self._bus.put_many(self.reader.records(upto_seq=start_seq, kinds=("events", "traces")))
        self._restart_from(start_seq)
        self._release()

    def _advance(self, dt: float) -> None:
        self.clock.set(min(self.end_t, self.clock.now() + max(0.0, dt)))

    def _restart_from(self, seq: int) -> None:
        self._iter = self.reader.records(after_seq=seq, with_seq=True)
        self._ahead = None

    def _release(self) -> int:
        if self._bus is None or self._iter is None:
            return 0
        now = self.clock.now()
        out: list[Record] = []
        while True:
            if self._ahead is None:
                self._ahead = next(self._iter, None)
                if self._ahead is None:
                    if now >= self.end_t:
                        self.ended, self.paused = True, True
                    break
            if self._ahead[1].t > now:
                break
            out.append(self._ahead[1])
            self._ahead = None
        self._bus.put_many(out)
        return len(out)
