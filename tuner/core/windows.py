"""Settled windows: the one rule for "what better means" (docs/ARCHITECTURE.md, "One measurement
path"), over plain (t, v) readings.

After a change (of setting, of load, a reconnect, the start of the data) the readings count only
once the server has settled: the later of SETTLE_S seconds and SETTLE_ITERATIONS decode iterations.
The settled time is cut into WINDOW_S windows; each window's mean is one observation. Two sides are
compared by the ratio of their medians with a percentile-bootstrap interval (fixed seed: the same
windows always give the same answer), and judged better / worse / within noise by that interval.
Time the server was away, and time a profiler capture slowed it, belongs to no side.

The A/B readout (tuner.core.ab, over the Store), the tuner (tuner.tuning), `once` and the report
(tuner.report, over a whole recording) all call these functions, so they cannot disagree.
Standard library only (an import-linter contract says so); it must not know the Store, a
recording, a server or a widget: callers hand in sequences.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from bisect import bisect_left
from typing import Iterable, Sequence

NAN = math.nan
SETTLE_S = 2.0
SETTLE_ITERATIONS = 20
WINDOW_S = 1.0
MIN_WINDOWS = 5
BOOTSTRAP_ROUNDS = 1000
SEED = 0
CONFIDENCE = 0.95
CAPTURE_CATCH_UP_S = 2.0     # after a capture the server works off the requests it held back
CAPTURE_REQUEST_S = 1.0      # a capture starts about this long before its first profiled iteration
CAPTURE_STALL_MIN_S = 2.0    # a capture known only by its event: at least this long before it ...
CAPTURE_LOOKBACK_S = 120.0   # ... and at most this long

BETTER = "better"
WORSE = "worse"
WITHIN_NOISE = "within noise"


def settled(iterations: float, seconds: float, settle_s: float = SETTLE_S,
            settle_iterations: int = SETTLE_ITERATIONS) -> bool:
    """True once both `iterations` completed and `seconds` passed since a change reach the rule."""
    return iterations >= settle_iterations and seconds >= settle_s


def settle_end(change_t: float, counter: Iterable[tuple[float, float]] | None = None,
               base: float = NAN, settle_s: float = SETTLE_S,
               settle_iterations: int = SETTLE_ITERATIONS) -> float:
    """When readings after a change at `change_t` start to count; +inf while not settled yet.

    `counter` holds the server's iteration counter readings (t, count) from `change_t` on, oldest
    first, and `base` its last reading at or before the change (NaN when there is none: a counter
    starts at 0). None means the server counts no iterations (no phase stream): the time rule alone.
    A count that goes down is a restarted counter: iterations count again from its new value.
    """
    end = change_t + settle_s
    if counter is None:
        return end
    done, prev = 0.0, (0.0 if math.isnan(base) else base)
    for t, v in counter:
        if math.isnan(v) or t < change_t:
            continue
        done += v - prev if v >= prev else v
        prev = v
        if settled(done, t - change_t, 0.0, settle_iterations):
            return max(end, t)
    return math.inf


def spans(t0: float, t1: float, exclude: Sequence[tuple[float, float]] = ()) -> list[tuple[float, float]]:
    """[t0, t1] minus the [a, b) intervals of `exclude`, as ordered spans."""
    out, start = [], t0
    for a, b in sorted(exclude):
        if b <= start or a >= t1:
            continue
        if a > start:
            out.append((start, a))
        start = max(start, b)
    if start < t1:
        out.append((start, t1))
    return out


def window_means(ts: Sequence[float], vs: Sequence[float], t0: float, t1: float, width: float = WINDOW_S,
                 exclude: Sequence[tuple[float, float]] = ()) -> list[float]:
    """Means of the available readings in consecutive [t0 + i*w, t0 + (i+1)*w) windows within [t0, t1].

    `ts` is sorted (oldest first) and `vs` its values; NaN readings are not available. Only complete
    windows count, and windows with no available reading are skipped. `exclude` holds [a, b)
    intervals left out (outages, captures): the windows restart after each one.
    """
    if exclude:
        return [m for a, b in spans(t0, t1, exclude) for m in window_means(ts, vs, a, b, width)]
    if not (t1 - t0 >= width):
        return []
    n = int((t1 - t0) // width)
    sums = [0.0] * n
    counts = [0] * n
    for k in range(bisect_left(ts, t0), bisect_left(ts, t0 + n * width)):
        v = vs[k]
        if math.isnan(v):
            continue
        i = int((ts[k] - t0) // width)
        if 0 <= i < n:                 # float rounding at the last edge: that reading is no window's
            sums[i] += v
            counts[i] += 1
    return [s / c for s, c in zip(sums, counts) if c]


def gaps(transitions: Iterable[tuple[float, bool, str]], end: float = math.inf) -> list[tuple[float, float, str]]:
    """(went away, came back, why) for every time the server was away, from (t, up, why) connection
    transitions in time order (t of a "down" is when it was last seen); an open gap runs to `end`."""
    out: list[tuple[float, float, str]] = []
    down: tuple[float, str] | None = None
    for t, up, why in transitions:
        if not up and down is None:
            down = (t, why)
        elif up and down is not None:
            out.append((down[0], t, down[1]))
            down = None
    if down is not None:
        out.append((down[0], end, down[1]))
    return out


def capture_span(event_t: float, starts: Iterable[float]) -> tuple[float, float]:
    """The time a profiler capture that ended at `event_t` slowed the server: from the earliest of
    its known `starts` (its stated length before the event, its first profiled iteration less
    CAPTURE_REQUEST_S) to CAPTURE_CATCH_UP_S after it (the burst of held-back work)."""
    return min(starts, default=event_t), event_t + CAPTURE_CATCH_UP_S


def stall_start(event_t: float, iter_ts: Sequence[float], iter_per_s: Sequence[float]) -> float:
    """Where a capture that states neither its length nor its first iteration began (an older
    recording): the profiler stalls a CPU server, so go back from its event while the server ran no
    iterations, at most CAPTURE_LOOKBACK_S and at least CAPTURE_STALL_MIN_S."""
    t0 = event_t - CAPTURE_STALL_MIN_S
    lo, hi = bisect_left(iter_ts, event_t - CAPTURE_LOOKBACK_S), bisect_left(iter_ts, event_t)
    for k in range(hi - 1, lo - 1, -1):
        if iter_per_s[k] > 0:
            break
        t0 = min(t0, iter_ts[k])
    return t0


def ratio_of_medians(before: Sequence[float], after: Sequence[float], rounds: int = BOOTSTRAP_ROUNDS,
                     seed: int = SEED, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(median(after)/median(before), lo, hi): the ratio and its percentile-bootstrap interval."""
    # Views ask every tick, but the windows change only once a second: remember recent answers.
    return _ratio_of_medians(tuple(before), tuple(after), rounds, seed, confidence)


@functools.lru_cache(maxsize=64)
def _ratio_of_medians(before: tuple[float, ...], after: tuple[float, ...], rounds: int, seed: int,
                      confidence: float) -> tuple[float, float, float]:
    median = statistics.median
    mb, ma = median(before), median(after)
    ratio = ma / mb if mb else NAN
    rng = random.Random(seed)
    nb, na = len(before), len(after)
    ratios = []
    for _ in range(rounds):
        b = median(rng.choices(before, k=nb))
        a = median(rng.choices(after, k=na))
        if b:
            ratios.append(a / b)
    return (ratio, *percentile_interval(ratios, confidence))


def percentile_interval(draws: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of bootstrap draws (NaNs without any)."""
    if not draws:
        return NAN, NAN
    d = sorted(draws)
    tail = (1 - confidence) / 2
    return d[int(tail * (len(d) - 1))], d[int(math.ceil((1 - tail) * (len(d) - 1)))]


def clustered_median_draws(groups: Sequence[Sequence[float]], rounds: int = BOOTSTRAP_ROUNDS,
                           seed: int = SEED) -> list[float]:
    """Bootstrap draws of the pooled median of windows that come in groups (one group per stretch of
    time a side ran, e.g. an A/B cycle): each draw resamples the groups, then the windows inside
    each drawn group. Empty groups are left out; no groups, no draws.

    Windows next to each other share the host's state (a stall, a busy neighbour, a slow stretch
    lasts seconds). Resampling windows alone treats a few seconds of luck as many independent
    readings and narrows the interval below the spread between groups; the two stages keep it."""
    gs = [tuple(g) for g in groups if len(g)]
    if not gs:
        return []
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        pooled: list[float] = []
        for g in rng.choices(gs, k=len(gs)):
            pooled += rng.choices(g, k=len(g))
        out.append(statistics.median(pooled))
    return out


def ratio_of_medians_clustered(before: Sequence[Sequence[float]], after: Sequence[Sequence[float]],
                               rounds: int = BOOTSTRAP_ROUNDS, seed: int = SEED,
                               confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """ratio_of_medians for grouped windows (clustered_median_draws): the ratio of the pooled
    medians and the interval of the two-stage bootstrap."""
    pb = [v for g in before for v in g]
    pa = [v for g in after for v in g]
    if not pb or not pa:
        return NAN, NAN, NAN
    mb = statistics.median(pb)
    ratio = statistics.median(pa) / mb if mb else NAN
    db = clustered_median_draws(before, rounds, seed)
    da = clustered_median_draws(after, rounds, seed + 1)
    return (ratio, *percentile_interval([a / b for a, b in zip(da, db) if b], confidence))


def judge(lo: float, hi: float) -> str:
    """better (the whole interval above 1), worse (below 1), else within noise."""
    if lo > 1.0:
        return BETTER
    if hi < 1.0:
        return WORSE
    return WITHIN_NOISE


def enough(before: Sequence[float], after: Sequence[float], min_windows: int = MIN_WINDOWS) -> bool:
    """Both sides have the windows a verdict needs (fewer: "not yet", or tentative in a report)."""
    return len(before) >= min_windows and len(after) >= min_windows
