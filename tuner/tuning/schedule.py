"""The per-batch-size schedule: the cost model fitted per batch bucket, the best setting per bucket,
and SGLang's `--speculative-adaptive-config` that pins each bucket to its tuned tier.

Buckets are probes.accept_buckets' batch buckets (SGLang's default adaptive thresholds plus the
powers of two; a batch belongs to the largest edge <= its size, as SGLang routes a batch to its
largest config key). Each bucket is predicted at the batch size it saw most (the cost model fits
per exact batch size) from the settled iterations whose `bs` falls in it.

A bucket's stage:
- `measured`: its best setting was itself measured at that batch size (at least MEASURED_ITERS
  settled iterations), so predicted and measured tok/s stand side by side;
- `predicted-only`: the best comes from the fit, nobody ran it there;
- `too little data`: fewer than `min_iters` settled iterations in the bucket (or nothing
  predictable); it has no best and is not pinned (SGLang routes it to the next lower key).

The JSON (`tune --schedule --json FILE`, read by benchmarks/schedule_ab.py `--from-tune FILE`):

    {"buckets": [{"bucket": "1", "bs_lo": 1, "bs_hi": 1, "bs": 1, "iterations": 812,
                  "best": {"speculative_num_steps": 5, ...} | null,      # server args
                  "predicted_tok_s": 91.2 | null, "measured_tok_s": 88.0 | null,
                  "stage": "measured" | "predicted-only" | "too little data",
                  "sglang_steps": 5 | null},                             # the chain pinned for SGLang
                 ...],
     "adaptive_config": {"1": {"candidate_steps": [5]}, "4": {...}} | null,
     "flags": ["--speculative-algorithm", "EAGLE3", ..., "--speculative-adaptive-config", "PATH"],
     "loads": [1, 2, 4],                  # [0]: the server's own traffic, no load driven
     "versus_fixed": {"fixed": {"speculative_num_steps": 3, ...}, "fixed_steps": 3,
                      "weights": {"1": 0.41, "16": 0.59},      # the time seen at each bucket
                      "ratios": {"1": 1.12, "16": 1.0}, "gain": 1.049} | null,
     "notes": ["..."],                    # thin buckets named, non-chain bests, one tier everywhere
     "problems": ["..."]}                 # added by the command: a load without data, refusals

`versus_fixed` is what the schedule is predicted to gain over the one chain that would do best
fixed: each bucket weighted by the host time its settled iterations took (on `--load 0` that is the
server's own traffic mix; a sweep spends about equal time per load), the fixed chain the one with
the best weighted tok/s, and the gain the weighted mean of the per-bucket ratios: the measure
benchmarks/schedule_ab.py judges the live A/B by. Null with fewer than two buckets with a best.

`bs_hi` is null for the last, open-ended bucket. Pure: nothing here measures or talks to a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from probes import accept_buckets as AB
from probes.names import SHARDED
from tuner.tuning.cost_model import CostModel, Prediction, best, fit_cost_model
from tuner.tuning.export import adaptive_config, adaptive_flags
from tuner.tuning.observations import Iteration, summarise
from tuner.tuning.settings import Setting

MEASURED = "measured"
PREDICTED_ONLY = "predicted-only"
TOO_LITTLE = "too little data"

MIN_BUCKET_ITERS = 20
"""Settled iterations a bucket needs before it gets a best setting (two of the live tuner's
shortest probes): fewer are batches seen only while requests came and went, which say little
about that batch size's costs."""
MEASURED_ITERS = 10
"""A best setting counts as measured with this many settled iterations of it (the live tuner's
shortest probe)."""
CONFIG_PATH = "tuned-adaptive.json"
SMALL_GAIN = 1.02
"""Below this predicted gain over the best fixed chain, the schedule is named as not worth much:
within the spread of most live A/B readings (benchmarks/results/schedule_ab_*.md)."""


def bucket_bounds(lo: int) -> tuple[int, int | None]:
    """(bs_lo, bs_hi) of the batch bucket starting at lo; bs_hi None for the last one."""
    edges = AB.BS_EDGES
    i = edges.index(lo)
    return lo, (edges[i + 1] - 1 if i + 1 < len(edges) else None)


def bucket_lo(bs: int) -> int:
    """The batch bucket (its smallest batch size) a batch of this size belongs to."""
    parsed = AB.parse_bucket(AB.bucket(AB.BS, bs))
    assert parsed is not None
    return parsed[1]


def time_by_bucket(iters: Iterable[Iteration]) -> dict[int, float]:
    """Batch bucket (its lo) → the host time (summed wall ms) of the iterations that ran in it."""
    out: dict[int, float] = {}
    for it in iters:
        out[bucket_lo(it.bs)] = out.get(bucket_lo(it.bs), 0.0) + max(it.wall_ms, 0.0)
    return out


def loads_to_sweep(max_running: int | None, max_load: int | None) -> list[int]:
    """1, 2, 4, … up to the smaller of the server's max_running_requests and --max-load; the cap
    itself is swept last when it is not a power of two."""
    caps = [c for c in (max_running, max_load) if isinstance(c, int) and c >= 1]
    cap = min(caps) if caps else 1
    out, v = [], 1
    while v <= cap:
        out.append(v)
        v *= 2
    if out[-1] != cap:
        out.append(cap)
    return out


@dataclass(frozen=True)
class BucketRow:
    lo: int
    hi: int | None
    iterations: int                  # settled iterations with bs in the bucket
    bs: int | None                   # the batch size the bucket is predicted at (most iterations)
    best: Prediction | None          # the best of the whole space there
    chain: Prediction | None         # the best chain on the target's TP group (what SGLang can pin)
    stage: str
    reason: str = ""

    @property
    def name(self) -> str:
        return str(self.lo)

    def range_text(self) -> str:
        return range_text(self.lo, self.hi)

    def predict(self, model: CostModel | None, s: Setting) -> Prediction | None:
        """s predicted at this bucket's batch size (None without a model or a batch size)."""
        if model is None or self.bs is None:
            return None
        return model.predict(s, self.bs)

    def to_json(self) -> dict[str, Any]:
        b = self.best
        return {"bucket": self.name, "bs_lo": self.lo, "bs_hi": self.hi, "bs": self.bs,
                "iterations": self.iterations,
                "best": b.setting.as_server_args() if b is not None else None,
                "predicted_tok_s": _num(b.tok_s) if b is not None else None,
                "predicted_sd": _num(b.sd) if b is not None else None,
                # Only a best measured long enough has a measured figure: a few iterations seen
                # while the load changed are noise beside a prediction.
                "measured_tok_s": _num(b.measured_tok_s) if b is not None and self.stage == MEASURED else None,
                "stage": self.stage, "reason": self.reason,
                "sglang_steps": self.chain.setting.steps if self.chain is not None else None}


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 3)


@dataclass(frozen=True)
class VersusFixed:
    """The schedule's chains against the best single chain, predicted per bucket and weighted."""

    fixed: Setting
    weights: Mapping[int, float]     # bucket lo → share of the time seen (sums to 1)
    ratios: Mapping[int, float]      # bucket lo → the bucket's pinned chain ÷ the fixed chain there
    gain: float                      # Σ weight × ratio

    def to_json(self) -> dict[str, Any]:
        return {"fixed": self.fixed.as_server_args(), "fixed_steps": self.fixed.steps,
                "weights": {str(lo): round(w, 4) for lo, w in self.weights.items()},
                "ratios": {str(lo): round(r, 4) for lo, r in self.ratios.items()},
                "gain": round(self.gain, 4)}


def versus_fixed(rows: Sequence[BucketRow], model: CostModel | None, chains: Sequence[Setting],
                 time_ms: Mapping[int, float]) -> VersusFixed | None:
    """What pinning each bucket to its own best chain gains over the one chain that does best over
    all of them, weighted by the time seen at each bucket (time_ms: bucket lo → summed wall ms).

    The fixed chain maximises the weighted tok/s, as a user choosing one `--speculative-num-steps`
    for this traffic would; the gain is the weighted mean of the per-bucket ratios (each bucket's
    pinned chain over the fixed one there). Only buckets with a pinned chain count, and a fixed
    candidate must be predictable at every one of them. None with fewer than two such buckets: one
    bucket's schedule is a fixed setting."""
    live = [r for r in rows if r.chain is not None and r.stage != TOO_LITTLE and time_ms.get(r.lo, 0.0) > 0]
    if model is None or len(live) < 2:
        return None
    total = sum(time_ms[r.lo] for r in live)
    weights = {r.lo: time_ms[r.lo] / total for r in live}
    scores: dict[Setting, tuple[float, dict[int, float]]] = {}
    for s in chains:
        per = {}
        for r in live:
            p = r.predict(model, s)
            if p is None or p.tok_s is None or not p.tok_s > 0:
                break
            per[r.lo] = p.tok_s
        else:
            scores[s] = (sum(weights[lo] * v for lo, v in per.items()), per)
    if not scores:
        return None
    # Ties go to the shallower chain (the cheaper one to run and to explain).
    fixed = max(scores, key=lambda s: (scores[s][0], -s.steps))
    per = scores[fixed][1]
    ratios = {r.lo: r.chain.tok_s / per[r.lo] for r in live}   # type: ignore[union-attr,operator]
    return VersusFixed(fixed, weights, ratios, sum(weights[lo] * ratios[lo] for lo in ratios))


@dataclass(frozen=True)
class Schedule:
    rows: tuple[BucketRow, ...]
    model: CostModel | None
    loads: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    vs_fixed: VersusFixed | None = None

    def row(self, lo: int) -> BucketRow | None:
        return next((r for r in self.rows if r.lo == lo), None)

    def pinned_chains(self) -> dict[int, Setting]:
        """bs_lo → the chain pinned there (buckets with too little data are left out)."""
        return {r.lo: r.chain.setting for r in self.rows if r.chain is not None and r.stage != TOO_LITTLE}

    def adaptive_config(self) -> dict | None:
        chains = self.pinned_chains()
        return adaptive_config(chains) if chains else None

    def flags(self, config_path: str = CONFIG_PATH) -> list[str]:
        chains = self.pinned_chains()
        return adaptive_flags(chains, config_path) if chains else []

    def to_json(self, config_path: str = CONFIG_PATH) -> dict[str, Any]:
        return {"buckets": [r.to_json() for r in self.rows], "adaptive_config": self.adaptive_config(),
                "flags": self.flags(config_path), "loads": list(self.loads), "notes": list(self.notes),
                "versus_fixed": self.vs_fixed.to_json() if self.vs_fixed is not None else None}


def _export_chain(s: Setting) -> bool:
    """A setting SGLang's adaptive config can pin: a chain (or tier 0) on the target's TP group,
    with no extra knob a tier cannot carry."""
    return s.topk == 1 and (s.steps == 0 or s.placement == SHARDED) and not s.extra


def fit_schedule(iters: Iterable[Iteration], space: Sequence[Setting], tp_size: int | None = None,
                 min_iters: int = MIN_BUCKET_ITERS, expected: Iterable[int] = (),
                 loads: Sequence[int] = ()) -> Schedule:
    """Settled iterations (any settings, any batch sizes) → one row per batch bucket.

    expected: batch sizes the caller meant to see (the swept loads); their buckets get a row even
    when no iteration landed there, so a load that never reached the server says so."""
    iters = list(iters)
    model = fit_cost_model(summarise(iters), tp_size) if iters else None
    counts: dict[int, dict[int, int]] = {}
    for it in iters:
        counts.setdefault(bucket_lo(it.bs), {}).setdefault(it.bs, 0)
        counts[bucket_lo(it.bs)][it.bs] += 1
    for bs in expected:
        counts.setdefault(bucket_lo(bs), {})
    rows = []
    chains = [s for s in space if _export_chain(s)]
    for lo in sorted(counts):
        per_bs = counts[lo]
        n = sum(per_bs.values())
        _, hi = bucket_bounds(lo)
        if not per_bs:
            rows.append(BucketRow(lo, hi, 0, None, None, None, TOO_LITTLE, "no iteration at this batch size"))
            continue
        bs = max(per_bs, key=lambda b: (per_bs[b], -b))
        if n < min_iters or model is None:
            rows.append(BucketRow(lo, hi, n, bs, None, None, TOO_LITTLE,
                                  f"{n} settled iterations (needs {min_iters})"))
            continue
        top = best(model.predict_all(space, bs))
        chain = best(model.predict_all(chains, bs))
        if top is None:
            rows.append(BucketRow(lo, hi, n, bs, None, None, TOO_LITTLE,
                                  "no setting is predictable here (one setting measured)"))
            continue
        stage = MEASURED if top.measured_n >= MEASURED_ITERS else PREDICTED_ONLY
        rows.append(BucketRow(lo, hi, n, bs, top, chain, stage))
    vs = versus_fixed(rows, model, chains, time_by_bucket(iters))
    notes = _notes(rows, vs)
    return Schedule(tuple(rows), model, tuple(loads), tuple(notes), vs)


def _notes(rows: Sequence[BucketRow], vs: VersusFixed | None = None) -> list[str]:
    out = []
    thin = [r for r in rows if r.stage == TOO_LITTLE]
    if thin:
        out.append("too little data at batch " + ", ".join(r.range_text() for r in thin)
                   + ": not pinned (SGLang routes those batch sizes to the next lower key)")
    for r in rows:
        if r.best is not None and r.chain is not None and r.chain.setting != r.best.setting:
            out.append(f"batch {r.range_text()}: the best, {r.best.setting.label()}, is not a chain on the "
                       f"target's TP group; SGLang is pinned to its best chain, {r.chain.setting.label()}")
    tiers = {r.chain.setting.steps for r in rows if r.chain is not None and r.stage != TOO_LITTLE}
    if len(tiers) == 1 and sum(1 for r in rows if r.chain is not None and r.stage != TOO_LITTLE) > 1:
        out.append(f"every bucket's best chain is steps {tiers.pop()}: a fixed setting does as well as "
                   "this schedule on this server")
    elif vs is not None and vs.gain < SMALL_GAIN:
        out.append(f"the schedule is predicted within {100 * (SMALL_GAIN - 1):.0f} % of one fixed setting, "
                   f"steps {vs.fixed.steps}, at the traffic seen: the buckets' optima are too close for "
                   "a per-batch choice to pay much")
    return out


def range_text(lo: int, hi: int | None, space: str = " ") -> str:
    """A batch bucket's sizes as text: `1`, `2–3`, `≥ 64` (`≥64` with space="")."""
    if hi is None:
        return f"≥{space}{lo}"
    return str(lo) if hi == lo else f"{lo}–{hi}"


def table_lines(doc: Mapping[str, Any]) -> list[str]:
    """The schedule as text, from its JSON (the `tune --schedule` readout)."""
    from tuner.core import setting as vocab

    def num(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}"

    out = [f"  {'batch':<8} {'iters':>6}  {'best setting':<32} {'predicted':>10} {'measured':>9}  stage"]
    ranges = {}
    for b in doc.get("buckets", []):
        rng = range_text(b["bs_lo"], b.get("bs_hi"))
        ranges[b["bucket"]] = rng
        best_s = b.get("best")
        words = vocab.words(best_s, sep=" ") if best_s else "—"
        stage = b.get("stage", "")
        if stage == TOO_LITTLE and b.get("reason"):
            stage += f" ({b['reason']})"
        out.append(f"  {rng:<8} {b.get('iterations', 0):>6}  {words:<32} {num(b.get('predicted_tok_s')):>10} "
                   f"{num(b.get('measured_tok_s')):>9}  {stage}")
    vs = doc.get("versus_fixed")
    if vs:
        per = ", ".join(f"batch {ranges.get(lo, lo)} {r:.2f}× ({100 * vs['weights'][lo]:.0f} % of the time)"
                        for lo, r in vs["ratios"].items())
        out.append(f"  against one fixed setting, steps {vs['fixed_steps']} (the best for this traffic): "
                   f"predicted {vs['gain']:.3f}×; {per}")
    return out
