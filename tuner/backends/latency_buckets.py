"""The server's latency histograms, scrape by scrape, into `latency_buckets` events of bucket deltas.

Each /metrics scrape gives cumulative bucket counts of SGLang's TTFT, inter-token latency, e2e and
queue-time histograms (tuner.core.latency.HISTOGRAMS); what a window saw is the difference between
two scrapes, so each scrape that moved is one event of the non-zero per-bucket deltas, which windows
sum. A histogram that began again (a restarted server) gives nothing for that interval. A server
without the histograms, or with unusable ones, is one `latency_unavailable` event per distinct
reason, never an exception. Must not keep more than the previous scrape, nor touch the store.
"""

from __future__ import annotations

from typing import Any

from tuner.backends.promtext import MetricSet
from tuner.core import latency as L
from tuner.core.events import EventKind
from tuner.core.records import Event


class LatencyBuckets:
    """Scrape -> events; one instance per server, fed from its metrics poller's thread."""

    def __init__(self) -> None:
        self._prev: dict[str, dict[float, float]] = {}
        self._said = ""

    def update(self, t: float, ms: MetricSet) -> list[Event]:
        out: list[Event] = []
        moved: dict[str, Any] = {}
        problems: list[str] = []
        present = False
        for kind, name in L.HISTOGRAMS.items():
            rows = ms.samples(name + "_bucket")
            if not rows:
                self._prev.pop(kind, None)
                continue
            present = True
            try:
                cur = L.cumulative(name, rows)
            except L.LatencyError as e:
                problems.append(str(e))
                self._prev.pop(kind, None)
                continue
            d = L.delta(cur, self._prev.get(kind))
            self._prev[kind] = cur
            if d:
                moved[kind] = L.buckets_data(d)
        reason = problems[0] if problems else ("" if present else L.NO_HISTOGRAMS)
        if reason and reason != self._said:
            out.append(Event(t, EventKind.LATENCY_UNAVAILABLE, {"reason": reason}))
        self._said = reason
        if moved:
            out.append(Event(t, EventKind.LATENCY_BUCKETS, moved))
        return out
