"""The A/B comparator (docs/ARCHITECTURE.md, "One measurement path"): was the last change better, and by how much?

The rule itself (settling, 1-s windows, ratio of medians, bootstrap interval, "not yet" below 5
windows a side, outages and captures left out) is tuner.core.windows'; this module applies it to the
Store (or any tuner.core.timeline.Timeline) around the newest config change, and between a
baseline's run and the setting running now. Time the server was away (from `disconnected` to the
end of the settling after `connected`) belongs to neither side: the load driver counts 0 tok/s while
the server is down, which says nothing about the setting. So does a profiler capture's time; both
spans are tuner.core.timeline.excluded, the report's too. Pure functions over a timeline; it must
not talk to servers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from tuner.core import windows as W
from tuner.core.events import AB_BOUNDARY_KINDS, EventKind
from tuner.core.timeline import Timeline, excluded, last_event, settle_end, window_means
from tuner.core.windows import (BOOTSTRAP_ROUNDS, MIN_WINDOWS, SEED, SETTLE_ITERATIONS, SETTLE_S, WINDOW_S,
                                ratio_of_medians)

NAN = math.nan
MAX_SIDE_S = 120.0          # older windows of a long-running setting say nothing new

NOT_YET = "not yet"
READY = "ready"
NO_CHANGE = "no change"

# settle_end, excluded and window_means are tuner.core.timeline's (the report's too), named here for
# the A/B's callers.
__all__ = ["ABResult", "BOOTSTRAP_ROUNDS", "MIN_WINDOWS", "SEED", "SETTLE_ITERATIONS", "SETTLE_S", "WINDOW_S",
           "compare_last_change", "compare_with_baseline", "excluded", "ratio_of_medians", "run_span",
           "settle_end", "window_means"]


@dataclass(frozen=True)
class ABResult:
    """One before/after comparison of one series.

    status is "no change" (nothing to compare against), "not yet" (fewer than MIN_WINDOWS windows on
    a side) or "ready" (ratio = median after / median before, [lo, hi] its 95 % interval).
    """

    series: str
    status: str
    change_t: float = NAN
    ratio: float = NAN
    lo: float = NAN
    hi: float = NAN
    median_before: float = NAN
    median_after: float = NAN
    n_before: int = 0
    n_after: int = 0

    @property
    def ready(self) -> bool:
        return self.status == READY

    def text(self) -> str:
        """One line for people, e.g. "+12.3 % [+8.1, +16.0] (82.1 -> 92.2)" or "not yet (3/5 after)"."""
        if self.status == NO_CHANGE:
            return "no change yet"
        if self.status == NOT_YET:
            return f"not yet ({self.n_before}/{MIN_WINDOWS} before, {self.n_after}/{MIN_WINDOWS} after)"

        def pct(x: float) -> str:
            return f"{(x - 1) * 100:+.1f}"
        return (f"{pct(self.ratio)} % [{pct(self.lo)}, {pct(self.hi)}] "
                f"({self.median_before:.4g} -> {self.median_after:.4g})")


def compare_last_change(store: Timeline, series: str, now: float, *, settle_s: float = SETTLE_S,
                        settle_iterations: int = SETTLE_ITERATIONS, width: float = WINDOW_S,
                        min_windows: int = MIN_WINDOWS, max_side_s: float = MAX_SIDE_S,
                        rounds: int = BOOTSTRAP_ROUNDS, seed: int = SEED) -> ABResult:
    """Compare `series` before vs after the newest config change at or before `now`."""
    change = last_event(store, EventKind.CONFIG_CHANGED, at=now)
    if change is None:
        return ABResult(series, NO_CHANGE)
    # The "before" side is the previous setting's steady part: from the boundary before it (a change,
    # load start/stop) plus its settling time, to the change. Outages are left out of both sides.
    prev = None
    for e in reversed(store.events(AB_BOUNDARY_KINDS, t1=change.t)):
        if e is not change and e.t < change.t:
            prev = e
            break
    # The start of the data settles like a change: the first readings after attaching (or the
    # start of a recording) may be a half-warm server's.
    b0 = settle_end(store, prev.t if prev else store.t_first, settle_s, settle_iterations)
    b0 = max(b0, change.t - max_side_s)
    # A boundary after the change (load stopped or started) ends the "after" side.
    later = [e for e in store.events(AB_BOUNDARY_KINDS, t0=change.t, t1=now)
             if e is not change and e.t > change.t]
    a1 = min([now] + [e.t for e in later])
    a0 = settle_end(store, change.t, settle_s, settle_iterations)
    a0 = max(a0, a1 - max_side_s) if math.isfinite(a0) else a0
    return _compare(store, series, change.t, (b0, change.t), (a0, a1), settle_s, settle_iterations, width,
                    min_windows, rounds, seed)


def _compare(store: Timeline, series: str, change_t: float, before_span: tuple[float, float],
             after_span: tuple[float, float], settle_s: float, settle_iterations: int, width: float,
             min_windows: int, rounds: int, seed: int) -> ABResult:
    (b0, b1), (a0, a1) = before_span, after_span
    away = excluded(store, settle_s, settle_iterations)
    before = window_means(store, series, b0, b1, width, away) if math.isfinite(b0) else []
    after = window_means(store, series, a0, a1, width, away) if math.isfinite(a0) else []
    if not W.enough(before, after, min_windows):
        return ABResult(series, NOT_YET, change_t=change_t, n_before=len(before), n_after=len(after))
    ratio, lo, hi = ratio_of_medians(before, after, rounds, seed)
    return ABResult(series, READY, change_t, ratio, lo, hi, statistics.median(before),
                    statistics.median(after), len(before), len(after))


def run_span(store: Timeline, at: float, now: float) -> tuple[float, float]:
    """[start, end) of the run of one setting (and one load state) that holds time `at`: from the
    boundary at or before it (a change, load start/stop; else the data's start) to the next one
    (else `now`)."""
    start = last_event(store, AB_BOUNDARY_KINDS, at=at)
    t0 = start.t if start is not None else store.t_first
    nxt = [e.t for e in store.events(AB_BOUNDARY_KINDS, t0=t0, t1=now) if e.t > t0]
    return t0, min([now] + nxt)


def compare_with_baseline(store: Timeline, series: str, now: float, baseline_at: float, *,
                          settle_s: float = SETTLE_S, settle_iterations: int = SETTLE_ITERATIONS,
                          width: float = WINDOW_S, min_windows: int = MIN_WINDOWS,
                          max_side_s: float = MAX_SIDE_S, rounds: int = BOOTSTRAP_ROUNDS,
                          seed: int = SEED) -> ABResult:
    """The setting running now (the same "after" side as compare_last_change) against the baseline:
    the setting that ran at `baseline_at` (the attach, or when the operator pinned it), over its
    own settled run. "no change" when the baseline's run is the one running now."""
    base0, base1 = run_span(store, min(baseline_at, now), now)
    now0, now1 = run_span(store, now, now)
    if base0 >= now0:
        return ABResult(series, NO_CHANGE)
    b0 = settle_end(store, base0, settle_s, settle_iterations)
    b0 = max(b0, base1 - max_side_s)
    a0 = settle_end(store, now0, settle_s, settle_iterations)
    a0 = max(a0, now1 - max_side_s) if math.isfinite(a0) else a0
    return _compare(store, series, now0, (b0, base1), (a0, now1), settle_s, settle_iterations, width,
                    min_windows, rounds, seed)
