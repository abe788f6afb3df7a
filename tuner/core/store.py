"""The store: one ring buffer per series, an event log and the last traces, with window queries: the
live side of tuner.core.timeline's Timeline.

Written by one thread only (the session's, through Session.tick), read by the same thread (TUI timer,
headless loop), so it takes no locks. Readers check `revision` and pull only the windows they draw.
It must not compute derived readings or talk to servers.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from typing import Iterable

from tuner.core.records import NAN, Event, Record, Sample, Trace
from tuner.core.timeline import Window

DEFAULT_CAPACITY = 4 * 3600 * 3   # ~3 h of a 4 Hz series
DEFAULT_EVENT_CAPACITY = 100_000
DEFAULT_TRACE_CAPACITY = 16


class _Ring:
    """Time-ordered (t, v) pairs, bounded; amortised O(1) append and O(log n) window lookup."""

    __slots__ = ("ts", "vs", "start", "capacity")

    def __init__(self, capacity: int) -> None:
        # Packed doubles: 16 bytes a reading instead of ~64 as Python floats in lists, which matters
        # for a tool kept open all day with a hundred series.
        self.ts = array("d")
        self.vs = array("d")
        self.start = 0              # index of the oldest live entry; older ones wait for compaction
        self.capacity = capacity

    def add(self, t: float, v: float) -> None:
        if not self.ts or t >= self.ts[-1]:
            self.ts.append(t)
            self.vs.append(v)
        else:
            # Rare: a producer stamped a reading slightly in the past (e.g. a phase-stream record
            # mapped onto the session clock). Keep time order so windows stay correct.
            i = bisect_right(self.ts, t, lo=self.start)
            self.ts.insert(i, t)
            self.vs.insert(i, v)
        if len(self.ts) - self.start > self.capacity:
            self.start += 1
            if self.start >= self.capacity:   # compact in one go: amortised O(1) per append
                del self.ts[: self.start]
                del self.vs[: self.start]
                self.start = 0

    def __len__(self) -> int:
        return len(self.ts) - self.start


class Store:
    """Ring buffers per series + an event log + the last traces; `revision` counts changes.

    Args:
        capacity: readings kept per series (the oldest are dropped first).
        event_capacity: events kept (the oldest are dropped first).
        trace_capacity: traces (with their bytes) kept.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, event_capacity: int = DEFAULT_EVENT_CAPACITY,
                 trace_capacity: int = DEFAULT_TRACE_CAPACITY) -> None:
        self._capacity = capacity
        self._event_capacity = event_capacity
        self._trace_capacity = trace_capacity
        self.clear()

    # -- writing (the session only) -------------------------------------------------------------

    def clear(self) -> None:
        """Forget everything (replay seeks use this); bumps the revision."""
        self._series: dict[str, _Ring] = {}
        self._events: list[Event] = []
        self._event_ts: list[float] = []
        self._event_seq: list[int] = []
        self.events_added = 0
        """Events added since the last clear(): a cursor for readers that must see each event once,
        even one that arrives late (a derived event is stamped with its iteration's time, which can
        be older than an event added before it)."""
        self._traces: list[Trace] = []
        self.t_first = NAN
        self.t_last = NAN
        self.revision = getattr(self, "revision", 0) + 1

    def add(self, record: Record) -> None:
        """Add one record. Call only from the session thread."""
        if isinstance(record, Sample):
            ring = self._series.get(record.series)
            if ring is None:
                ring = self._series[record.series] = _Ring(self._capacity)
            ring.add(record.t, float(record.value))
        elif isinstance(record, Event):
            self.events_added += 1
            if not self._event_ts or record.t >= self._event_ts[-1]:
                self._events.append(record)
                self._event_ts.append(record.t)
                self._event_seq.append(self.events_added)
            else:
                i = bisect_right(self._event_ts, record.t)
                self._events.insert(i, record)
                self._event_ts.insert(i, record.t)
                self._event_seq.insert(i, self.events_added)
            if len(self._events) > self._event_capacity:
                drop = len(self._events) - self._event_capacity
                del self._events[:drop]
                del self._event_ts[:drop]
                del self._event_seq[:drop]
        elif isinstance(record, Trace):
            self._traces.append(record)
            del self._traces[: max(0, len(self._traces) - self._trace_capacity)]
        else:
            raise TypeError(f"not a record: {type(record).__name__}")
        if math.isnan(self.t_first) or record.t < self.t_first:
            self.t_first = record.t
        if math.isnan(self.t_last) or record.t > self.t_last:
            self.t_last = record.t

    def add_many(self, records: Iterable[Record]) -> int:
        n = 0
        for r in records:
            self.add(r)
            n += 1
        if n:
            self.revision += 1
        return n

    # -- reading ----------------------------------------------------------------------------------

    def series_names(self, prefix: str = "") -> list[str]:
        """Names of the series seen so far (sorted), optionally only those under a prefix."""
        return sorted(n for n in self._series if n.startswith(prefix))

    def window(self, series: str, t0: float = -math.inf, t1: float = math.inf) -> Window:
        """Readings with t0 <= t <= t1, oldest first (empty when the series is unknown)."""
        ring = self._series.get(series)
        if ring is None:
            return Window(series, (), ())
        lo = bisect_left(ring.ts, t0, lo=ring.start)
        hi = bisect_right(ring.ts, t1, lo=lo)
        return Window(series, tuple(ring.ts[lo:hi]), tuple(ring.vs[lo:hi]))

    def latest(self, series: str, at: float = math.inf) -> Sample | None:
        """The newest reading at or before `at` (default: the newest), or None."""
        ring = self._series.get(series)
        if ring is None or not len(ring):
            return None
        i = bisect_right(ring.ts, at, lo=ring.start) - 1
        if i < ring.start:
            return None
        return Sample(ring.ts[i], series, ring.vs[i])

    def value(self, series: str, at: float = math.inf) -> float:
        """The newest value at or before `at`, NaN when there is none (never raises)."""
        s = self.latest(series, at)
        return NAN if s is None else s.value

    def events(self, kind: str | Iterable[str] | None = None, t0: float = -math.inf,
               t1: float = math.inf) -> list[Event]:
        """Events with t0 <= t <= t1 (oldest first), optionally only of some kinds."""
        lo = bisect_left(self._event_ts, t0)
        hi = bisect_right(self._event_ts, t1, lo=lo)
        evs = self._events[lo:hi]
        if kind is None:
            return evs
        kinds = {kind} if isinstance(kind, str) else set(kind)
        return [e for e in evs if e.kind in kinds]

    def events_since(self, added: int) -> list[Event]:
        """Events added after the first `added` (see `events_added`), oldest first by time. A cursor
        beyond `events_added` means the store was cleared since: then every event is new."""
        if added > self.events_added:
            added = 0
        if added == self.events_added:
            return []
        return [e for e, n in zip(self._events, self._event_seq) if n > added]

    def last_event(self, kind: str | Iterable[str], at: float = math.inf) -> Event | None:
        """The newest event of the kind(s) at or before `at`, or None."""
        kinds = {kind} if isinstance(kind, str) else set(kind)
        hi = bisect_right(self._event_ts, at)
        for e in reversed(self._events[:hi]):
            if e.kind in kinds:
                return e
        return None

    def traces(self, trace_id: str | None = None) -> list[Trace]:
        """The kept traces (oldest first), optionally those of one capture."""
        return [tr for tr in self._traces if trace_id is None or tr.trace_id == trace_id]

    def __len__(self) -> int:
        return sum(len(r) for r in self._series.values()) + len(self._events) + len(self._traces)
