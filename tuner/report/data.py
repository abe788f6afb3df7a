"""Everything a report needs from one recording, read once: header, series, events, trace summaries.

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
from typing import Any, Iterator

from tuner.core.records import Event, Sample, Trace, thaw
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
    events: list[Event]
    traces: list[TraceInfo]
    problems: list[str]
    t_first: float
    t_last: float

    @property
    def length_s(self) -> float:
        return self.t_last - self.t_first if math.isfinite(self.t_first) else 0.0

    def get(self, name: str) -> Series:
        return self.series.get(name) or Series(name)

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.series if n.startswith(prefix))

    def events_of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def server_info(self) -> dict[str, Any]:
        """The first server_info event's data, else the header's server_info."""
        for e in self.events:
            if e.kind == "server_info":
                return thaw(e.data)
        return dict(self.header.get("server_info") or {})


def load(path: str | Path) -> RecordingData:
    """Read a recording for reporting. Raises RecordingError only when nothing is readable."""
    reader = open_recording(path)
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
