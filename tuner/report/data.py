"""Everything a report needs from one recording, read once: header, series, events, trace summaries;
the recorded side of tuner.core.timeline's Timeline (the Store is the live one).

Reads only the file (through the core's reader), never a server. A damaged file is read as far as it
goes: the reader's one-line problems travel along in `problems`, and a file with nothing readable
raises the core's RecordingError. Trace bytes are not kept (reports of hours-long recordings must
fit in memory); the Perfetto export reads them again, one trace at a time. Must not import textual.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from tuner.core.events import EventKind
from tuner.core.records import Event, Sample, Trace, thaw
from tuner.core.timeline import Window
from tuner.recording import open_recording


@dataclass
class Series:
    """One series' readings, oldest first (t in recording seconds; NaN = not available)."""

    name: str
    t: array = field(default_factory=lambda: array("d"))
    v: array = field(default_factory=lambda: array("d"))

    def between(self, t0: float, t1: float) -> tuple[array, array]:
        """Readings with t0 <= t < t1."""
        i, j = bisect_left(self.t, t0), bisect_left(self.t, t1)
        return self.t[i:j], self.v[i:j]

    def finite_between(self, t0: float, t1: float) -> list[float]:
        return [x for x in self.between(t0, t1)[1] if not math.isnan(x)]

    def at_or_before(self, t: float) -> float:
        i = bisect_right(self.t, t)
        return self.v[i - 1] if i else math.nan


@dataclass(frozen=True)
class TraceInfo:
    """One stored rank file of a capture, without its bytes."""

    t: float
    trace_id: str
    rank: int
    name: str
    size: int
    analysis: dict[str, Any] | None


@dataclass
class RecordingData:
    path: Path
    header: dict[str, Any]
    series: dict[str, Series]
    event_list: list[Event]         # oldest first
    trace_list: list[TraceInfo]
    problems: list[str]
    t_first: float
    t_last: float

    def __post_init__(self) -> None:
        self.event_list = sorted(self.event_list, key=lambda e: e.t)    # stable: equal times keep their order
        self._event_ts = [e.t for e in self.event_list]

    @property
    def length_s(self) -> float:
        return self.t_last - self.t_first if math.isfinite(self.t_first) else 0.0

    def get(self, name: str) -> Series:
        return self.series.get(name) or Series(name)

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.series if n.startswith(prefix))

    # -- tuner.core.timeline.Timeline -----------------------------------------------------------------

    def events(self, kind: str | Iterable[str] | None = None, t0: float = -math.inf,
               t1: float = math.inf) -> list[Event]:
        """Events with t0 <= t <= t1 (oldest first), optionally only of some kinds."""
        lo = bisect_left(self._event_ts, t0)
        evs = self.event_list[lo:bisect_right(self._event_ts, t1, lo=lo)]
        if kind is None:
            return evs
        kinds = {kind} if isinstance(kind, str) else set(kind)
        return [e for e in evs if e.kind in kinds]

    def window(self, series: str, t0: float = -math.inf, t1: float = math.inf) -> Window:
        """One series' readings with t0 <= t <= t1, oldest first."""
        s = self.get(series)
        i = bisect_left(s.t, t0)
        j = bisect_right(s.t, t1, lo=i)
        return Window(series, tuple(s.t[i:j]), tuple(s.v[i:j]))

    def value(self, series: str, at: float = math.inf) -> float:
        """The newest reading at or before `at`, NaN when there is none."""
        return self.get(series).at_or_before(at)

    def traces(self, trace_id: str | None = None) -> list[TraceInfo]:
        """The stored capture files (without their bytes), optionally those of one capture."""
        return [tr for tr in self.trace_list if trace_id is None or tr.trace_id == trace_id]

    def server_info(self) -> dict[str, Any]:
        """The first server_info event's data, else the header's server_info."""
        for e in self.event_list:
            if e.kind == EventKind.SERVER_INFO:
                return thaw(e.data)
        return dict(self.header.get("server_info") or {})


def load(path: str | Path, server: str | None = None) -> RecordingData:
    """Read a recording for reporting (server: one member of a fleet recording). Raises
    RecordingError only when nothing is readable."""
    reader = open_recording(path, server)
    try:
        series: dict[str, Series] = {}
        events: list[Event] = []
        traces: list[TraceInfo] = []
        for rec in reader.records():
            if isinstance(rec, Sample):
                s = series.get(rec.series)
                if s is None:
                    s = series[rec.series] = Series(rec.series)
                if s.t and rec.t < s.t[-1]:
                    # Producers on different threads may hand in readings a hair out of order;
                    # series are kept sorted so windows can bisect.
                    i = bisect_right(s.t, rec.t)
                    s.t.insert(i, rec.t)
                    s.v.insert(i, rec.value)
                else:
                    s.t.append(rec.t)
                    s.v.append(rec.value)
            elif isinstance(rec, Event):
                events.append(rec)
            elif isinstance(rec, Trace):
                traces.append(TraceInfo(rec.t, rec.trace_id, rec.rank, rec.name, len(rec.data),
                                        None if rec.analysis is None else thaw(rec.analysis)))
        events.sort(key=lambda e: e.t)
        # A damaged file may not answer min/max over its index: the records read say it too.
        seen = [s.t[0] for s in series.values() if s.t] + [e.t for e in events[:1]] + [t.t for t in traces]
        last = [s.t[-1] for s in series.values() if s.t] + [e.t for e in events[-1:]] + [t.t for t in traces]
        t_first = min([reader.t_first] + seen) if math.isfinite(reader.t_first) else min(seen, default=math.nan)
        t_last = max([reader.t_last] + last) if math.isfinite(reader.t_last) else max(last, default=math.nan)
        return RecordingData(Path(path), dict(reader.header), series, events, traces, list(reader.warnings),
                             t_first, t_last)
    finally:
        reader.close()


def trace_bytes(path: str | Path) -> Iterator[Trace]:
    """The stored traces with their bytes, one at a time (for the Perfetto export)."""
    reader = open_recording(path)
    try:
        yield from reader.records(kinds=("traces",))
    finally:
        reader.close()
