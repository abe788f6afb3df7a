"""The arithmetic of benchmarks/schedule_ab.py, kept apart so it can be tested without a server.

What it holds: tok/s per 1-s window from phase records, the settled part of a load phase, the
median of an arm's windows with its bootstrap interval, the per-phase ratios between arms and
their time-weighted mean, the PASS/MISS goal, each bucket's best setting and whether they
coincide, the best fixed setting over the moving load, the adaptive config that pins each
bucket's best, the seeded arm order, the wall-time estimate of a plan and its refusal, and the
reading of `specdecode-tune tune --schedule --json`.

Pure functions over plain values: no HTTP, no server, no clock. The settle rule and the ratio's
bootstrap are tuner.core.windows' (the one rule for "what better means"), never a copy.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tuner.core import windows as W

ARMS = ("schedule", "fixed", "acceptance")
"""The three arms: the tuned schedule (each bucket's best pinned), the best fixed setting of the
same sweep, and SGLang's acceptance-only policy with its default tiers."""
ARM_TITLES = {"schedule": "schedule", "fixed": "best fixed", "acceptance": "acceptance-only"}
GOAL_RATIO = 1.05
MIN_GOAL_CYCLES = 6


class PlanError(ValueError):
    """A plan or an input file that cannot be run; the message is one line."""


# -- windows over phase records ---------------------------------------------------------------------
def window_rates(ts: Sequence[float], counts: Sequence[float], t0: float, t1: float,
                 width: float = W.WINDOW_S, exclude: Sequence[tuple[float, float]] = ()) -> list[float]:
    """Tokens per second in each complete [t0 + i*w, t0 + (i+1)*w) window within [t0, t1]: the sum
    of `counts` (committed tokens of the iterations that ended at `ts`, sorted) over the window,
    divided by its width. A window in which no iteration ended is a real 0 (the server made no
    tokens), not a missing reading. `exclude` spans (captures) are left out; windows restart after each.
    """
    out: list[float] = []
    for a, b in W.spans(t0, t1, exclude):
        n = int((b - a) // width) if b - a >= width else 0
        sums = [0.0] * n
        for t, c in zip(ts, counts):
            i = int((t - a) // width) if t >= a else -1
            if 0 <= i < n:
                sums[i] += c
        out += [s / width for s in sums]
    return out


def settled_from(change_t: float, record_ts: Sequence[float], settle_s: float = W.SETTLE_S,
                 settle_iterations: int = W.SETTLE_ITERATIONS) -> float:
    """When a phase that began at `change_t` (a load or arm switch) starts to count: the later of
    settle_s seconds and settle_iterations iterations ended after it (tuner.core.windows' rule);
    +inf when the phase never settled."""
    counter = [(t, float(i + 1)) for i, t in enumerate(sorted(t for t in record_ts if t >= change_t))]
    return W.settle_end(change_t, counter, 0.0, settle_s, settle_iterations)


def median_interval(values: Sequence[float], rounds: int = W.BOOTSTRAP_ROUNDS, seed: int = W.SEED,
                    confidence: float = W.CONFIDENCE) -> tuple[float, float, float]:
    """(median, lo, hi): the median of the windows and its percentile-bootstrap interval (the same
    resampling as windows.ratio_of_medians, with a fixed seed)."""
    if not values:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    meds = [statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds)]
    return (statistics.median(values), *W.percentile_interval(meds, confidence))


def median_interval_by_cycle(cycles: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(median, lo, hi) of an arm's windows pooled over its cycles, the interval resampling cycles
    and then windows (tuner.core.windows.clustered_median_draws): an arm's cycles run minutes apart
    on a host whose state lasts seconds, so its windows are not independent readings."""
    pooled = [v for c in cycles for v in c]
    if not pooled:
        return math.nan, math.nan, math.nan
    return (statistics.median(pooled), *W.percentile_interval(W.clustered_median_draws(cycles)))


def capture_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Graph captures over a run, from the phase records' `captures` lists: how many, of how many
    distinct keys, and the re-captures (a key captured again: the engine's graph cache dropped it,
    so a setting revisited later stalls again). Re-captures are an artefact of the cache's size, not
    of the setting, and cost the phase they land in its windows."""
    seen: Counter = Counter()
    failed = 0
    for r in records:
        for c in r.get("captures") or ():
            seen[(c.get("phase"), c.get("placement"), c.get("rows"), tuple(c.get("shape") or ()))] += 1
            failed += not c.get("ok", True)
    n = sum(seen.values())
    return {"captures": n, "keys": len(seen), "recaptures": n - len(seen), "failed": failed}


def ratio(num: Sequence[float], den: Sequence[float]) -> tuple[float, float, float]:
    """median(num) / median(den) with its 95 % bootstrap interval (tuner.core.windows)."""
    if not num or not den:
        return math.nan, math.nan, math.nan
    return W.ratio_of_medians(den, num)


def ratio_by_cycle(num: Sequence[Sequence[float]], den: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """ratio() for windows grouped by A/B cycle: the pooled medians' ratio, the interval resampling
    cycles and then windows (see median_interval_by_cycle)."""
    return W.ratio_of_medians_clustered(den, num)


def time_weighted(values: Mapping[Any, float], weights: Mapping[Any, float]) -> float:
    """Σ w·v / Σ w over the keys of `weights` (seconds the script spends at each load); NaN when a
    weighted key has no finite value (a missing phase is not a neutral 1.0)."""
    total = sum(weights.values())
    if total <= 0:
        return math.nan
    acc = 0.0
    for k, w in weights.items():
        v = values.get(k, math.nan)
        if not math.isfinite(v):
            return math.nan
        acc += w * v
    return acc / total


def same_steps_as_one(ratios: Mapping[str, Mapping[Any, tuple[float, float, float]]],
                      same: Mapping[str, Sequence[Any]]) -> dict[str, dict[Any, tuple[float, float, float]]]:
    """`ratios` with each (arm, load) in `same` (the schedule and that arm ran the very same steps
    there) read as exactly 1.0, its interval kept: two runs of one setting differ only by the host's
    noise, and noise must not count for or against the schedule."""
    return {arm: {ld: ((1.0, *r[1:]) if ld in same.get(arm, ()) else r) for ld, r in per.items()}
            for arm, per in ratios.items()}


@dataclass(frozen=True)
class Goal:
    passed: bool
    why: str


def goal(ratios: Mapping[str, Mapping[Any, tuple[float, float, float]]], weights: Mapping[Any, float],
         cycles: int, min_ratio: float = GOAL_RATIO, min_cycles: int = MIN_GOAL_CYCLES) -> Goal:
    """The issue's goal for the schedule: against each other arm (`ratios[arm][load]` = schedule/arm
    (ratio, lo, hi)), the time-weighted mean ratio ≥ min_ratio and no load phase whose interval lies
    wholly below 1.0, over at least min_cycles cycles. `why` names every shortfall."""
    misses = []
    for arm, per_load in ratios.items():
        twm = time_weighted({k: v[0] for k, v in per_load.items()}, weights)
        if not twm >= min_ratio:
            misses.append(f"schedule/{ARM_TITLES.get(arm, arm)} time-weighted {twm:.3f} < {min_ratio}")
        for load, (_, _lo, hi) in per_load.items():
            if hi < 1.0:
                misses.append(f"schedule/{ARM_TITLES.get(arm, arm)} at load {load}: interval wholly below 1.0 "
                              f"(hi {hi:.3f})")
    if cycles < min_cycles:
        misses.append(f"{cycles} cycles < the {min_cycles} the goal asks for")
    if misses:
        return Goal(False, "; ".join(misses))
    return Goal(True, f"time-weighted ≥ {min_ratio} against each arm, no phase wholly below 1.0")


# -- the sweep's conclusions ------------------------------------------------------------------------
def best_per_bucket(table: Mapping[int, Mapping[int, float]]) -> dict[int, int]:
    """{bucket: steps with the highest tok/s there} (ties go to fewer steps: cheaper to run)."""
    out = {}
    for bucket, row in table.items():
        finite = {s: v for s, v in row.items() if math.isfinite(v)}
        if finite:
            out[bucket] = max(finite, key=lambda s: (finite[s], -s))
    return out


def bests_coincide(bests: Mapping[int, int]) -> bool:
    """True when every bucket's best is the same setting: the schedule is then a fixed setting and
    the A/B can only show ≈ 1.0 against it (a finding to explain, not a pass)."""
    return len(bests) > 1 and len(set(bests.values())) == 1


def best_fixed(table: Mapping[int, Mapping[int, float]], weights: Mapping[int, float]) -> tuple[int, float]:
    """(steps, tok/s): the one setting with the best time-weighted tok/s over the moving load (each
    weighted bucket's tok/s times the seconds spent there), among settings measured at all of them."""
    scores = {}
    for s in set.intersection(*(set(table.get(b, {})) for b in weights)) if weights else ():
        scores[s] = time_weighted({b: table[b][s] for b in weights}, weights)
    scores = {s: v for s, v in scores.items() if math.isfinite(v)}
    if not scores:
        raise PlanError("no setting was measured at every load bucket: no best fixed setting")
    s = max(scores, key=lambda k: (scores[k], -k))
    return s, scores[s]


def schedule_ceiling(table: Mapping[int, Mapping[int, float]], weights: Mapping[int, float], fixed: int) -> float:
    """The most a schedule can gain over the best fixed setting by the sweep's own figures: the
    time-weighted mean over the buckets of (the bucket's best tok/s) / (the fixed setting's tok/s
    there), the same mean the A/B's schedule/fixed is judged by. Below the goal's 1.05 the goal
    cannot be met on this host and model whatever the schedule does: the buckets' optima are
    too close (or equal) for a per-bucket choice to pay."""
    ratios = {}
    for b in weights:
        row = {s: v for s, v in table.get(b, {}).items() if math.isfinite(v)}
        if not row or not math.isfinite(row.get(fixed, math.nan)):
            return math.nan
        ratios[b] = max(row.values()) / row[fixed]
    return time_weighted(ratios, weights)


def thresholds(buckets: Sequence[int]) -> list[int]:
    """Batch-size thresholds for the measured buckets (concurrencies, ascending): the first covers
    batch 1; each later one starts at the geometric middle between its bucket and the one below,
    so a batch goes to the bucket it is nearest to on a log scale."""
    bs = sorted(set(buckets))
    out = [1]
    for lo, hi in zip(bs, bs[1:]):
        out.append(max(out[-1] + 1, math.ceil(math.sqrt(lo * hi))))
    return out


def schedule_config(bests: Mapping[int, int]) -> dict[str, dict]:
    """SGLang's adaptive config pinning each bucket's best: one candidate per tier."""
    buckets = sorted(bests)
    return {str(t): {"candidate_steps": [bests[b]]} for t, b in zip(thresholds(buckets), buckets)}


# -- the plan ---------------------------------------------------------------------------------------
def arm_order(cycles: int, seed: int, arms: Sequence[str] = ARMS) -> list[str]:
    """One arm per cycle, every arm once per round of len(arms) cycles, each round a seeded
    permutation (so host drift does not favour an arm that always runs first)."""
    if cycles < len(arms) or cycles % len(arms):
        raise PlanError(f"--cycles {cycles} must be a multiple of the {len(arms)} arms (one arm per cycle, "
                        f"each arm as often)")
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(cycles // len(arms)):
        rnd = list(arms)
        rng.shuffle(rnd)
        out += rnd
    return out


@dataclass(frozen=True)
class Plan:
    """What one invocation will do, for the wall-time estimate."""

    sweep_points: int           # (bucket, setting) pairs measured
    sweep_s: float              # measured seconds per point
    settle_s: float
    cycles: int
    phase_s: Sequence[float]    # seconds at load 1, at load C
    warmup_s: float             # per phase of the warm-up cycle each arm gets
    arms: int = len(ARMS)
    startup_s: float = 30.0
    switch_s: float = 1.0       # a live switch and a load change, each
    drain_s: float = 0.0        # open loop: the requests in flight at a cycle's end finish under it
    capture_s: float = 0.0      # CUDA: capturing the graphs a new (steps, batch) shape needs, per sweep point

    def estimate_s(self) -> float:
        sweep = self.sweep_points * (self.settle_s + self.sweep_s + self.switch_s + self.capture_s)
        cycle = sum(self.phase_s) + len(self.phase_s) * self.switch_s + self.drain_s
        warm = self.arms * (self.warmup_s * len(self.phase_s) + len(self.phase_s) * self.switch_s) \
            if self.cycles else 0.0
        return self.startup_s + sweep + warm + self.cycles * cycle


def check_plan(plan: Plan, max_wall_s: float | None) -> float:
    """The estimate in seconds; PlanError (one line) when it cannot fit max_wall_s."""
    est = plan.estimate_s()
    if max_wall_s and est > max_wall_s:
        raise PlanError(f"this plan needs about {est:.0f} s, over --max-wall-s {max_wall_s:.0f}: run the sweep "
                        f"and the A/B in separate calls (--only sweep, then --only ab --table FILE), or lower "
                        f"--cycles, --phase-s or --sweep-s")
    return est


def phase_seconds(text: str) -> tuple[float, float]:
    """`--phase-s`: one number (the same at load 1 and at load C) or two (1,C)."""
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        raise PlanError(f"--phase-s: expected S or S1,SC in seconds, got {text!r}") from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not all(math.isfinite(p) and p > 0 for p in parts):
        raise PlanError(f"--phase-s: expected S or S1,SC (seconds > 0), got {text!r}")
    return parts[0], parts[1]


def poisson_arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """Seeded Poisson arrival offsets in [0, duration) at `rate` per second: the same script for
    every cycle, so every arm sees the same requests at the same moments."""
    if not rate > 0:
        raise PlanError(f"--open-loop: the rate must be > 0 requests/s, got {rate!r}")
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), linear between ranks; NaN for no values."""
    v = sorted(values)
    if not v:
        return math.nan
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


# -- tune --schedule --json --------------------------------------------------------------------------
def from_tune(obj: Any, where: str = "--from-tune") -> tuple[dict[int, int], dict[str, dict]]:
    """({bucket's low batch size: steps pinned there}, adaptive config) from `specdecode-tune tune
    --schedule --json` (tuner.tuning.schedule's shape): {"buckets": [{"bucket", "bs_lo", "bs_hi",
    "best": {server args} | null, "sglang_steps": the chain pinned | null, ...}, ...],
    "adaptive_config": {...} | null}. A bucket's pinned steps are its `sglang_steps` (the chain the
    config pins when the best is a tree or off the TP group), else its best's steps when that is a
    chain; a bucket with neither (too little data) is not pinned and is left out. The config is
    checked by SGLang's rules (probes.adaptive_policy).

    Raises:
        PlanError: one line naming what is missing or wrong.
    """
    from probes import adaptive_policy

    if not isinstance(obj, dict):
        raise PlanError(f"{where}: expected the JSON object of tune --schedule --json")
    rows = obj.get("buckets")
    if not isinstance(rows, list) or not rows:
        raise PlanError(f'{where}: no "buckets" list (is this tune --schedule --json output?)')
    bests: dict[int, int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise PlanError(f"{where}: buckets[{i}] is not an object")
        lo = row.get("bs_lo")
        if isinstance(lo, bool) or not isinstance(lo, int) or lo < 1:
            raise PlanError(f"{where}: buckets[{i}] has no bs_lo (a batch size >= 1)")
        best = row.get("best") if isinstance(row.get("best"), dict) else {}
        steps = row.get("sglang_steps")
        if steps is None and int(best.get("speculative_eagle_topk", 1) or 1) == 1:
            steps = best.get("speculative_num_steps")
        if steps is None:
            continue                   # too little data there: the config does not pin it either
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise PlanError(f"{where}: buckets[{i}]: steps must be a whole number >= 0, got {steps!r}")
        bests[lo] = steps
    cfg = obj.get("adaptive_config")
    if cfg is None or not bests:
        raise PlanError(f"{where}: no bucket has a chain to pin (adaptive_config is null: the sweep saw too "
                        f"little of every bucket)")
    try:
        cfg = adaptive_policy.config_json(adaptive_policy.parse_config(cfg))
    except adaptive_policy.AdaptiveConfigError as e:
        raise PlanError(f"{where}: adaptive_config: {e}") from None
    return bests, cfg
