"""The A/B of a latency figure: the setting running now against the previous one (or a baseline),
judged by the load driver's exact timings with a bootstrap over requests.

The sides are the throughput A/B's (tuner.core.ab: each setting's settled run, at most MAX_SIDE_S,
split at changes and load starts/stops); a side's requests are those sent and finished inside it
(tuner.core.latency.requests_in), and the interval comes from resampling whole requests
(latency.bootstrap_ratio). Lower is better here: "better" means the figure fell. Pure functions over
a timeline (the store or a recording's); it must not talk to servers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.core import latency as L
from tuner.core import windows as W
from tuner.core.ab import MAX_SIDE_S, run_span
from tuner.core.events import EventKind
from tuner.core.timeline import Timeline, last_event, settle_end

MIN_REQUESTS = 5
"""Requests a side needs before a verdict (below: "not yet")."""


@dataclass(frozen=True)
class LatencyAB:
    """figure (e.g. itl_p99) after / before; [lo, hi] its 95 % interval over requests.
    status: "no change", "not yet" or "ready"; verdict: better (fell), worse (rose), within noise."""

    figure: str
    status: str
    ratio: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    before_s: float = math.nan
    after_s: float = math.nan
    n_before: int = 0
    n_after: int = 0

    @property
    def verdict(self) -> str:
        if self.status != "ready":
            return self.status
        # The tok/s judge reads a ratio above 1 as better; for a latency it is worse.
        return {W.BETTER: W.WORSE, W.WORSE: W.BETTER}.get(W.judge(self.lo, self.hi), W.WITHIN_NOISE)

    def text(self) -> str:
        if self.status != "ready":
            return f"{self.figure}: {self.status} ({self.n_before}+{self.n_after} requests)"
        return (f"{self.figure} {L.ms_text(self.before_s)} -> {L.ms_text(self.after_s)} "
                f"{(self.ratio - 1) * 100:+.1f} % [{(self.lo - 1) * 100:+.1f}, {(self.hi - 1) * 100:+.1f}]: "
                f"{self.verdict} ({self.n_before}+{self.n_after} requests)")


def compare_latency(store: Timeline, now: float, kind: str = "itl", q: float = 0.99,
                    baseline_at: float | None = None, min_requests: int = MIN_REQUESTS,
                    rounds: int = 400) -> LatencyAB:
    """The figure `kind` at quantile q, before vs after the newest config change at or before `now`
    (or the baseline's run at `baseline_at` vs the run now)."""
    got = sides(store, now, kind, q, baseline_at, min_requests)
    return got if isinstance(got, LatencyAB) else judge(*got, kind, q, rounds)


def sides(store: Timeline, now: float, kind: str = "itl", q: float = 0.99, baseline_at: float | None = None,
          min_requests: int = MIN_REQUESTS
          ) -> LatencyAB | tuple[str, list[L.RequestTiming], list[L.RequestTiming]]:
    """(figure, the requests before, the requests after): the cheap part, read from the timeline;
    a LatencyAB ("no change", "not yet") when there is nothing to judge. The TUI calls it on its own
    thread and `judge` (the bootstrap, 1-2 s) elsewhere."""
    figure = f"{kind}_p{round(q * 100)}"
    if baseline_at is None:
        change = last_event(store, EventKind.CONFIG_CHANGED, at=now)
        if change is None:
            return LatencyAB(figure, "no change")
        before = run_span(store, change.t - 1e-9, now)
    else:
        before = run_span(store, min(baseline_at, now), now)
    after = run_span(store, now, now)
    if before[0] >= after[0]:
        return LatencyAB(figure, "no change")
    events = store.events(EventKind.LOAD_REQUEST)
    out = []
    for t0, t1 in (before, after):
        s0 = max(settle_end(store, t0), t1 - MAX_SIDE_S)
        out.append(L.requests_in(events, s0, t1) if math.isfinite(s0) else [])
    b, a = out
    if len(b) < min_requests or len(a) < min_requests:
        return LatencyAB(figure, "not yet", n_before=len(b), n_after=len(a))
    return figure, b, a


def judge(figure: str, b: list[L.RequestTiming], a: list[L.RequestTiming], kind: str = "itl", q: float = 0.99,
          rounds: int = 400) -> LatencyAB:
    """The verdict over two sides' requests: the ratio and its bootstrap interval over requests."""
    ratio, lo, hi = L.bootstrap_ratio(b, a, kind, q, rounds=rounds)
    return LatencyAB(figure, "ready", ratio, lo, hi, L.figure(b, kind, q), L.figure(a, kind, q), len(b), len(a))
