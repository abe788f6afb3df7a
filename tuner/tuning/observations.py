"""Phase-stream records turned into the tuner's observations: one `Iteration` per decode step,
settled (warm-up after a change dropped) and summarised per setting and batch size.

Input is the phase stream's record dict (docs/ARCHITECTURE.md, "The phase stream"). A malformed
record raises ValueError with a one-line reason; nothing here talks to a server or fits a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from probes.names import ALL_PHASES as PHASES
from probes.names import (DRAFT, DRAFT_EXTEND, DRAFT_TOKENS, PLACEMENT, PREFILL, R_PHASE_MS, SHARDED, STEPS, TOPK, VERIFY, VERIFY_SAMPLE)
from tuner.backends.phase_pages import record_config, record_knobs
from tuner.core.setting import Setting, extra_knobs
from tuner.core.windows import SETTLE_ITERATIONS, SETTLE_S, settled


@dataclass(frozen=True)
class Iteration:
    """One decode iteration as the cost model sees it (times in ms, rank 0's)."""

    t: float
    epoch: int
    setting: Setting
    bs: int
    wall_ms: float
    phase_ms: Mapping[str, float]
    comm_ms: Mapping[str, float]
    accepted: tuple[int, ...]       # correct drafts per request
    committed: int                  # tokens committed by the whole batch this iteration
    comm_calls: Mapping[str, int] = None  # type: ignore[assignment]  # collectives per phase
    simulated: bool = False
    emulated_comm: bool = False
    adaptive: bool = False          # the engine's adaptive controller picked this iteration's tier

    @property
    def sched_ms(self) -> float:
        """T_sched: everything in the iteration that is not draft/verify/sample/extend/prefill."""
        work = sum(self.phase_ms.get(p, 0.0) for p in (DRAFT, VERIFY, VERIFY_SAMPLE,
                                                        DRAFT_EXTEND, PREFILL))
        return max(self.wall_ms - work, 0.0)


def _num(d: Mapping, key: str, kind: type = float, rec: Mapping | None = None) -> float:
    """d[key] as a finite number; `rec` is the record `d` was read from (d itself by default)."""
    rec = d if rec is None else rec
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        name = record_knobs().get(key, key)   # a knob is named as the record spells it
        raise ValueError(f"phase record {rec.get('seq', '?')}: {name!r} is not a finite number: {v!r}")
    return kind(v)


def parse_record(rec: Mapping) -> Iteration:
    """One phase-stream record → Iteration; ValueError (one line) when it is malformed."""
    if not isinstance(rec, Mapping):
        raise ValueError(f"phase record is not an object: {type(rec).__name__}")
    knobs = record_config(rec)              # the one reading of a record's knobs (the panels' too)
    steps = int(_num(knobs, STEPS, int, rec))
    topk = int(_num(knobs, TOPK, int, rec)) if steps > 0 else 1
    n = int(_num(knobs, DRAFT_TOKENS, int, rec)) if steps > 0 else 1
    placement = SHARDED if knobs[PLACEMENT] is None else knobs[PLACEMENT]
    extra = tuple((k.key, rec[k.key]) for k in extra_knobs() if rec.get(k.key) is not None)
    try:
        setting = Setting(steps, topk, n, str(placement), extra)
    except ValueError as e:
        raise ValueError(f"phase record {rec.get('seq', '?')}: {e}") from None
    phases, comms = rec.get(R_PHASE_MS), rec.get("comm_ms", {})
    if not isinstance(phases, Mapping) or not isinstance(comms, Mapping):
        raise ValueError(f"phase record {rec.get('seq', '?')}: phase_ms/comm_ms must be objects")
    phase_ms = {p: _num(phases, p) if p in phases else 0.0 for p in PHASES}
    # A phase missing from comm_ms is "not available" (collectives inside CUDA graphs, SGLang's
    # plugin), never 0: it must not make a what-if look free.
    comm_ms = {p: _num(comms, p) if p in comms else math.nan for p in PHASES}
    calls = rec.get("comm_calls", {})
    if not isinstance(calls, Mapping):
        raise ValueError(f"phase record {rec.get('seq', '?')}: comm_calls must be an object")
    comm_calls = {p: int(_num(calls, p, int)) if p in calls else 0 for p in PHASES}
    accepted = rec.get("accepted", [])
    if not isinstance(accepted, list) or not all(isinstance(a, int) and a >= 0 for a in accepted):
        raise ValueError(f"phase record {rec.get('seq', '?')}: 'accepted' must be a list of ints >= 0")
    bs = int(_num(rec, "bs", int))
    if bs < 1:
        raise ValueError(f"phase record {rec.get('seq', '?')}: bs must be >= 1")
    if "committed" in rec:
        committed = int(_num(rec, "committed", int))
    else:
        committed = sum(accepted) + len(accepted) if accepted else bs
    wall = _num(rec, "wall_ms")
    if wall <= 0:
        raise ValueError(f"phase record {rec.get('seq', '?')}: wall_ms must be > 0")
    return Iteration(
        t=_num(rec, "t"), epoch=int(_num(rec, "epoch", int)), setting=setting, bs=bs,
        wall_ms=wall, phase_ms=phase_ms, comm_ms=comm_ms, accepted=tuple(accepted),
        committed=committed, comm_calls=comm_calls, simulated=bool(rec.get("simulated", False)), emulated_comm=bool(rec.get("emulated_comm", False)),
        adaptive=rec.get("adaptive") is True,
    )


def settle(iters: Sequence[Iteration], warmup_iters: int = SETTLE_ITERATIONS,
           warmup_s: float = SETTLE_S) -> list[Iteration]:
    """Drop each config epoch's warm-up ("What better means", tuner.core.windows.settled: after a
    change, the later of 2 s and 20 iterations): an iteration counts once
    `warmup_iters` iterations of its epoch came before it and `warmup_s` seconds passed since the
    epoch's first (the records carry server time only, so the change itself is not on their
    clock). Iterations are taken in the order given (stream order)."""
    out: list[Iteration] = []
    first_t: dict[int, float] = {}
    before: dict[int, int] = {}
    for it in iters:
        t0 = first_t.setdefault(it.epoch, it.t)
        n = before.get(it.epoch, 0)
        before[it.epoch] = n + 1
        if settled(n, it.t - t0, warmup_s, warmup_iters):
            out.append(it)
    return out


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error; with ≥ 20 values the error comes from 10 contiguous batch
    means, so slow drift inside a measurement widens the error instead of hiding in it."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, abs(mean) * 0.5 + 1e-6  # one value: a wide, honest error
    if n >= 20:
        nb = 10
        size = n // nb
        batches = [sum(values[i * size:(i + 1) * size]) / size for i in range(nb)]
        bm = sum(batches) / nb
        var = sum((b - bm) ** 2 for b in batches) / (nb - 1)
        return mean, math.sqrt(var / nb)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


TERMS = (DRAFT, DRAFT_EXTEND, VERIFY, VERIFY_SAMPLE, PREFILL, "sched")


@dataclass(frozen=True)
class SettingStats:
    """Everything measured at one (setting, bs): per-term means ± standard errors (ms)."""

    setting: Setting
    bs: int
    n: int
    terms: Mapping[str, tuple[float, float]]      # draft, draft_extend, verify, verify_sample, prefill, sched
    comm: Mapping[str, tuple[float, float]]       # draft, draft_extend, verify, verify_sample
    comm_calls: Mapping[str, float]               # mean collectives per iteration, per phase
    wall: tuple[float, float]
    tok_per_s: float                              # Σ committed / Σ wall (this batch size only)
    accepted_hist: tuple[int, ...]                # h[j] = requests that accepted exactly j drafts

    def to_json(self) -> dict:
        return {**self.setting.to_json(), "bs": self.bs, "n": self.n,
                "terms_ms": {k: list(v) for k, v in self.terms.items()},
                "comm_ms": {k: list(v) for k, v in self.comm.items()},
                "comm_calls": dict(self.comm_calls),
                "wall_ms": list(self.wall), "tok_per_s": self.tok_per_s,
                "accepted_hist": list(self.accepted_hist)}


def summarise(iters: Iterable[Iteration]) -> list[SettingStats]:
    """Group settled iterations by (setting, bs) and reduce each group to means ± errors."""
    groups: dict[tuple[Setting, int], list[Iteration]] = {}
    for it in iters:
        groups.setdefault((it.setting, it.bs), []).append(it)
    out = []
    for (setting, bs), its in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        terms = {
            DRAFT: mean_se([i.phase_ms[DRAFT] for i in its]),
            DRAFT_EXTEND: mean_se([i.phase_ms[DRAFT_EXTEND] for i in its]),
            VERIFY: mean_se([i.phase_ms[VERIFY] for i in its]),
            VERIFY_SAMPLE: mean_se([i.phase_ms[VERIFY_SAMPLE] for i in its]),
            # Records without prefill (older servers) read 0 here and keep it in sched, as before.
            PREFILL: mean_se([i.phase_ms[PREFILL] for i in its]),
            "sched": mean_se([i.sched_ms for i in its]),
        }
        comm = {p: mean_se([i.comm_ms[p] for i in its if math.isfinite(i.comm_ms[p])])
                for p in (DRAFT, DRAFT_EXTEND, VERIFY, VERIFY_SAMPLE)}
        calls = {p: sum((i.comm_calls or {}).get(p, 0) for i in its) / len(its)
                 for p in (DRAFT, DRAFT_EXTEND, VERIFY, VERIFY_SAMPLE)}
        hist: list[int] = []
        for i in its:
            for a in i.accepted:
                if a >= len(hist):
                    hist.extend([0] * (a + 1 - len(hist)))
                hist[a] += 1
        wall_total = sum(i.wall_ms for i in its)
        tps = 1000.0 * sum(i.committed for i in its) / wall_total
        out.append(SettingStats(setting, bs, len(its), terms, comm, calls,
                                mean_se([i.wall_ms for i in its]), tps, tuple(hist)))
    return out
