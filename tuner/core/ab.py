"""The A/B comparator (ARCHITECTURE "What better means"): was the last change better, and by how much?

After a change, drop the settling time (the later of 2 s and 20 iterations), cut each side into 1-s
windows, take each window's mean reading, and report the ratio of the sides' medians with a 95 %
bootstrap interval (fixed seed, so the same data always gives the same answer). Until each side has
5 windows the answer is "not yet". Time the server was away (from `disconnected` to the end of the
settling after `connected`) belongs to neither side: the load driver counts 0 tok/s while the server
is down, which says nothing about the setting. Pure functions over a Store; it must not talk to servers.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import dataclass
from typing import Sequence

from tuner.core import series as S
from tuner.core.events import AB_BOUNDARY_KINDS, EventKind
from tuner.core.store import Store

NAN = math.nan
SETTLE_S = 2.0
SETTLE_ITERATIONS = 20
WINDOW_S = 1.0
MIN_WINDOWS = 5
MAX_SIDE_S = 120.0          # older windows of a long-running setting say nothing new
BOOTSTRAP_ROUNDS = 1000
SEED = 0

NOT_YET = "not yet"
READY = "ready"
NO_CHANGE = "no change"


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


def window_means(store: Store, series: str, t0: float, t1: float, width: float = WINDOW_S,
                 exclude: Sequence[tuple[float, float]] = ()) -> list[float]:
    """Means of the available readings in consecutive [t0 + i*w, t0 + (i+1)*w) windows within [t0, t1].

    Only complete windows count; windows with no available reading are skipped. `exclude` holds
    [a, b) intervals left out (outages): the windows restart after each one.
    """
    if exclude:
        return [m for a, b in _spans(t0, t1, exclude) for m in window_means(store, series, a, b, width)]
    if not (t1 - t0 >= width):
        return []
    n = int((t1 - t0) // width)
    win = store.window(series, t0, t0 + n * width)
    sums = [0.0] * n
    counts = [0] * n
    for t, v in win:
        if math.isnan(v):
            continue
        i = min(int((t - t0) // width), n - 1)
        if t >= t0 + (i + 1) * width:      # a reading exactly on the last edge belongs to no window
            continue
        sums[i] += v
        counts[i] += 1
    return [s / c for s, c in zip(sums, counts) if c]


def ratio_of_medians(before: Sequence[float], after: Sequence[float], rounds: int = BOOTSTRAP_ROUNDS,
                     seed: int = SEED, confidence: float = 0.95) -> tuple[float, float, float]:
    """(median(after)/median(before), lo, hi): the ratio and its percentile-bootstrap interval."""
    # Views ask every tick, but the windows change only once a second: remember recent answers.
    return _ratio_of_medians(tuple(before), tuple(after), rounds, seed, confidence)


@functools.lru_cache(maxsize=64)
def _ratio_of_medians(before: tuple[float, ...], after: tuple[float, ...], rounds: int, seed: int,
                      confidence: float) -> tuple[float, float, float]:
    mb, ma = statistics.median(before), statistics.median(after)
    ratio = ma / mb if mb else NAN
    rng = random.Random(seed)
    nb, na = len(before), len(after)
    ratios = []
    median = statistics.median
    for _ in range(rounds):
        b = median(rng.choices(before, k=nb))
        a = median(rng.choices(after, k=na))
        if b:
            ratios.append(a / b)
    if not ratios:
        return ratio, NAN, NAN
    ratios.sort()
    tail = (1 - confidence) / 2
    lo = ratios[int(tail * (len(ratios) - 1))]
    hi = ratios[int(math.ceil((1 - tail) * (len(ratios) - 1)))]
    return ratio, lo, hi


def _spans(t0: float, t1: float, exclude: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """[t0, t1] minus the [a, b) intervals of `exclude`, as ordered spans."""
    spans, start = [], t0
    for a, b in sorted(exclude):
        if b <= start or a >= t1:
            continue
        if a > start:
            spans.append((start, a))
        start = max(start, b)
    if start < t1:
        spans.append((start, t1))
    return spans


def outages(store: Store, settle_s: float = SETTLE_S, settle_iterations: int = SETTLE_ITERATIONS
            ) -> list[tuple[float, float]]:
    """[disconnected, settled after connected) intervals; an outage not over yet runs to +inf.

    A reconnect is treated like a change: the server (maybe restarted, with cold caches) settles
    again before its readings count."""
    out: list[tuple[float, float]] = []
    down = None
    for e in store.events((EventKind.DISCONNECTED, EventKind.CONNECTED)):
        if e.kind == EventKind.DISCONNECTED and down is None:
            down = e.t
        elif e.kind == EventKind.CONNECTED and down is not None:
            out.append((down, settle_end(store, e.t, settle_s, settle_iterations)))
            down = None
    if down is not None:
        out.append((down, math.inf))
    return out


def settle_end(store: Store, change_t: float, settle_s: float = SETTLE_S,
               settle_iterations: int = SETTLE_ITERATIONS) -> float:
    """When readings after a change start to count: the later of +settle_s and +settle_iterations.

    Iterations are known only where the server has a phase stream (series server/iterations_total);
    otherwise the time rule alone applies.
    """
    end = change_t + settle_s
    base = store.latest(S.SERVER_ITERATIONS, at=change_t)
    if base is None:
        return end
    win = store.window(S.SERVER_ITERATIONS, change_t)
    for t, v in win:
        if v - base.value >= settle_iterations:
            return max(end, t)
    return math.inf                 # not enough iterations yet: nothing after the change counts


def compare_last_change(store: Store, series: str, now: float, *, settle_s: float = SETTLE_S,
                        settle_iterations: int = SETTLE_ITERATIONS, width: float = WINDOW_S,
                        min_windows: int = MIN_WINDOWS, max_side_s: float = MAX_SIDE_S,
                        rounds: int = BOOTSTRAP_ROUNDS, seed: int = SEED) -> ABResult:
    """Compare `series` before vs after the newest config change at or before `now`."""
    change = store.last_event(EventKind.CONFIG_CHANGED, at=now)
    if change is None:
        return ABResult(series, NO_CHANGE)
    # The "before" side is the previous setting's steady part: from the boundary before it (a change,
    # load start/stop) plus its settling time, to the change. Outages are left out of both sides.
    prev = None
    for e in reversed(store.events(AB_BOUNDARY_KINDS, t1=change.t)):
        if e is not change and e.t < change.t:
            prev = e
            break
    b0 = settle_end(store, prev.t, settle_s, settle_iterations) if prev else store.t_first
    b0 = max(b0, change.t - max_side_s)
    # A boundary after the change (load stopped or started) ends the "after" side.
    later = [e for e in store.events(AB_BOUNDARY_KINDS, t0=change.t, t1=now)
             if e is not change and e.t > change.t]
    a1 = min([now] + [e.t for e in later])
    a0 = settle_end(store, change.t, settle_s, settle_iterations)
    a0 = max(a0, a1 - max_side_s) if math.isfinite(a0) else a0
    away = outages(store, settle_s, settle_iterations)
    before = window_means(store, series, b0, change.t, width, away) if math.isfinite(b0) else []
    after = window_means(store, series, a0, a1, width, away) if math.isfinite(a0) else []
    if len(before) < min_windows or len(after) < min_windows:
        return ABResult(series, NOT_YET, change_t=change.t, n_before=len(before), n_after=len(after))
    ratio, lo, hi = ratio_of_medians(before, after, rounds, seed)
    return ABResult(series, READY, change.t, ratio, lo, hi, statistics.median(before),
                    statistics.median(after), len(before), len(after))
