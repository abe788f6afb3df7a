"""One timeline for live and recorded data: the small interface the Store (a live session) and a
loaded recording (tuner.report.data.RecordingData) both offer, and the time worked out over it once.

The interface: events by kind within a span, a series within a span (and its reading at a time),
traces by capture id, and the first and last times seen. Over it, written once here: when readings
after a change settle, the time the server was away, the time a profiler capture slowed it, the
zero-length cuts of a load start or stop, and the window means left once those are taken out. The
A/B readout (tuner.core.ab), the tuner (tuner.tuning) and the report (tuner.report) all call these,
so a live session and its recording cannot disagree. The rule itself (settling, windows, capture
spans) is tuner.core.windows'.

Pure functions over a Timeline; must not talk to servers, read files or know a widget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from tuner.core import series as S
from tuner.core import windows as W
from tuner.core.events import EventKind
from tuner.core.records import Event
from tuner.core.windows import SETTLE_ITERATIONS, SETTLE_S, WINDOW_S

Span = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Window:
    """Readings of one series in a time range, oldest first. NaN values are kept (gaps)."""

    series: str
    t: tuple[float, ...]
    v: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.t)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(zip(self.t, self.v))

    def finite(self) -> list[float]:
        """The values that are available (not NaN)."""
        return [v for v in self.v if not math.isnan(v)]


class CaptureFile(Protocol):
    """What the timeline needs of one stored rank file of a capture (a Trace, or a recording's
    TraceInfo without its bytes)."""

    t: float
    trace_id: str
    analysis: Mapping[str, Any] | None


@runtime_checkable
class Timeline(Protocol):
    """What the Store and a loaded recording both answer. Spans are inclusive at both ends."""

    t_first: float          # NaN while nothing is known
    t_last: float

    def events(self, kind: str | Iterable[str] | None = None, t0: float = -math.inf,
               t1: float = math.inf) -> Sequence[Event]:
        """Events with t0 <= t <= t1, oldest first, optionally only of some kinds."""
        ...

    def window(self, series: str, t0: float = -math.inf, t1: float = math.inf) -> Window:
        """One series' readings with t0 <= t <= t1, oldest first (empty when unknown)."""
        ...

    def value(self, series: str, at: float = math.inf) -> float:
        """The newest reading at or before `at`; NaN when there is none."""
        ...

    def traces(self, trace_id: str | None = None) -> Sequence[CaptureFile]:
        """The stored capture files, oldest first, optionally those of one capture."""
        ...


def last_event(tl: Timeline, kind: str | Iterable[str], at: float = math.inf) -> Event | None:
    """The newest event of the kind(s) at or before `at`, or None."""
    evs = tl.events(kind, t1=at)
    return evs[-1] if evs else None


def settle_end(tl: Timeline, change_t: float, settle_s: float = SETTLE_S,
               settle_iterations: int = SETTLE_ITERATIONS, until: float = math.inf) -> float:
    """When readings after a change at `change_t` start to count (tuner.core.windows.settle_end),
    from the server's iteration counter (series server/iterations_total, where the server has a
    phase stream; else the time rule alone). Only the counter's readings up to `until` are read;
    +inf when it has not settled by then."""
    if math.isnan(tl.value(S.SERVER_ITERATIONS)) and not len(tl.window(S.SERVER_ITERATIONS)):
        return W.settle_end(change_t, None, settle_s=settle_s)
    base = tl.value(S.SERVER_ITERATIONS, at=change_t)
    return W.settle_end(change_t, tl.window(S.SERVER_ITERATIONS, change_t, until), base, settle_s,
                        settle_iterations)


def gaps(tl: Timeline, end: float = math.inf) -> list[tuple[float, float, str]]:
    """(went away, came back, error) for every time the server was away, from `disconnected` (its
    `since`: when it was last seen) to `connected`; a gap not over yet runs to `end`."""
    moves = ((float(e.data.get("since", e.t) or e.t), e.kind == EventKind.CONNECTED, str(e.data.get("error", "")))
             for e in tl.events((EventKind.DISCONNECTED, EventKind.CONNECTED)))
    return W.gaps(moves, end)


def captures(tl: Timeline) -> list[tuple[float, float, str]]:
    """(t0, t1, trace_id) for the time each profiler capture slowed the server
    (tuner.core.windows.capture_span): from its stated length before its event, or its first
    profiled iteration, or else the stall before it, to the catch-up after it; never before the
    data's start. Not settled: see `excluded`."""
    out = []
    for e in tl.events(EventKind.TRACE_CAPTURED):
        tid = str(e.data.get("trace_id", ""))
        starts = []
        secs = e.data.get("seconds")
        if isinstance(secs, (int, float)) and secs > 0:
            starts.append(e.t - float(secs))
        for tr in tl.traces(tid):
            starts += first_iterations(tr.analysis)
        if not starts:
            its = tl.window(S.SERVER_ITER_PER_S, e.t - W.CAPTURE_LOOKBACK_S, e.t)
            starts.append(W.stall_start(e.t, its.t, its.v))
        t0, t1 = W.capture_span(e.t, starts)
        out.append((max(t0, tl.t_first), t1, tid))
    return out


def first_iterations(analysis: object) -> list[float]:
    """Where a capture's analysis says each rank's first profiled iteration began, less the time
    the capture request takes (tuner.core.windows.CAPTURE_REQUEST_S), in seconds. Reads a frozen
    analysis (the store's) as it is: thawing it on every tick would copy every iteration."""
    out = []
    ranks = analysis.get("ranks") if isinstance(analysis, Mapping) else None
    for r in ranks if isinstance(ranks, (list, tuple)) else ():
        its = r.get("iterations") if isinstance(r, Mapping) else None
        base = r.get("base_time_ns") if isinstance(r, Mapping) else None
        if isinstance(its, (list, tuple)) and its and isinstance(its[0], Mapping) \
                and isinstance(base, (int, float)) and base:
            start = its[0].get("start_us", 0)
            if isinstance(start, (int, float)):
                out.append(float(base) / 1e9 + float(start) / 1e6 - W.CAPTURE_REQUEST_S)
    return out


def load_cuts(tl: Timeline) -> list[tuple[float, float, str]]:
    """Load started or stopped: zero-length cuts (t, t, kind), after which a setting's time settles
    again (the A/B's boundaries, tuner.core.events.AB_BOUNDARY_KINDS)."""
    return [(e.t, e.t, e.kind) for e in tl.events((EventKind.LOAD_STARTED, EventKind.LOAD_STOPPED))]


def settled_after(tl: Timeline, spans: Iterable[Sequence[float]], settle_s: float = SETTLE_S,
                  settle_iterations: int = SETTLE_ITERATIONS) -> list[Span]:
    """Each (t0, t1, ...) span as [t0, settled after t1): the server comes back from an outage or a
    capture like from a change, so it settles again before its readings count."""
    return [(s[0], settle_end(tl, s[1], settle_s, settle_iterations) if math.isfinite(s[1]) else s[1])
            for s in spans]


def outages(tl: Timeline, settle_s: float = SETTLE_S, settle_iterations: int = SETTLE_ITERATIONS) -> list[Span]:
    """[disconnected, settled after connected) intervals; an outage not over yet runs to +inf."""
    return settled_after(tl, gaps(tl), settle_s, settle_iterations)


def excluded(tl: Timeline, settle_s: float = SETTLE_S, settle_iterations: int = SETTLE_ITERATIONS) -> list[Span]:
    """Time that belongs to no setting: outages and profiler captures, each with its settling."""
    return outages(tl, settle_s, settle_iterations) + settled_after(tl, captures(tl), settle_s, settle_iterations)


def window_means(tl: Timeline, series: str, t0: float, t1: float, width: float = WINDOW_S,
                 exclude: Sequence[Span] = ()) -> list[float]:
    """tuner.core.windows.window_means over one series of the timeline, within [t0, t1]."""
    win = tl.window(series, t0, t1)
    return W.window_means(win.t, win.v, t0, t1, width, exclude)
