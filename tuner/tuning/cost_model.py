"""The cost model: predicted tok/s for every setting, from measured phase costs and acceptance.

As the design note's "Acceptance" writes it (eagle3.md §5.3), per decode iteration

    T = T_extend(B·N_ext) + (s−1)·T_draft_step(B·k) + T_verify(B·N) + T_sample + T_prefill + T_sched
    tok/s = B·τ / T

Each term is fitted per (placement, batch size) from per-setting means of the phase stream:
  draft        ~ a + b·(s−1) + c·(s−1)·(k−1)   (b = one chain draft step, c = extra per branch)
  draft_extend ~ a + b·N                        (N_ext = N: the extend runs over the verify width)
  verify       ~ a + b·N                        (target forward over N tokens per request)
  verify_sample~ a + b·N
  prefill      ~ a                              (the load's cost: admissions per iteration × their
                                                 prefill; no knob changes it, so one constant per group:
                                                 the mean over every iteration of the group, not a
                                                 1/se²-weighted fit, since a probe that saw no
                                                 admission reads 0 ± 0 and would outweigh the rest)
  sched        ~ a                              (wall − the five above: scheduling, "other", gaps)
steps = 0 (tier 0, draft kept warm) is its own measured point, or extrapolated from the verify line at N=1.
The collective part of draft and draft_extend is fitted the same way, which gives the "what if the
draft left the TP group" readout. Acceptance comes from `acceptance.py`.

Uncertainty: each term's standard error propagates from its fit's covariance (error bars from the
per-setting means, widened by lack of fit); τ's error is added in relative quadrature.
Pure: nothing here measures, sleeps or talks to a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from probes.names import DRAFT, DRAFT_EXTEND, PREFILL, REPLICATED, SHARDED, VERIFY, VERIFY_SAMPLE
from tuner.core.windows import SETTLE_ITERATIONS, SETTLE_S
from tuner.tuning.acceptance import AcceptanceModel, TauEstimate, fit_acceptance
from tuner.tuning.linfit import LinearFit, fit_linear
from tuner.tuning.observations import SettingStats
from tuner.tuning.settings import Setting

DRAFT_COLS = ("1", "s-1", "(s-1)(k-1)")
LINE_COLS = ("1", "N")
CONST_COLS = ("1",)

TERM_COLS: dict[str, tuple[str, ...]] = {
    "draft": DRAFT_COLS,
    DRAFT_EXTEND: LINE_COLS,
    "verify": LINE_COLS,
    VERIFY_SAMPLE: LINE_COLS,
    PREFILL: CONST_COLS,
    "sched": CONST_COLS,
}
# Terms that a speculation-off (steps = 0) iteration has too.
OFF_TERMS = (VERIFY, VERIFY_SAMPLE, PREFILL, "sched")
COMM_TERMS = (DRAFT, DRAFT_EXTEND, VERIFY)
# Ordering of how trustworthy a prediction is; a prediction takes its weakest input's basis.
BASIS_ORDER = ("measured", "fitted", "extrapolated", "what-if")


def features(cols: Sequence[str], s: Setting) -> list[float]:
    values = {"1": 1.0, "s-1": float(s.steps - 1), "(s-1)(k-1)": float((s.steps - 1) * (s.topk - 1)),
              "N": float(s.num_draft_tokens)}
    return [values[c] for c in cols]


def _weakest(*bases: str) -> str:
    return max(bases, key=BASIS_ORDER.index)


@dataclass(frozen=True)
class GroupFit:
    """The fitted terms of one (placement, bs): speculative terms, comm parts, and the off point."""

    placement: str
    bs: int
    terms: Mapping[str, LinearFit]
    comm: Mapping[str, LinearFit]
    comm_per_call: float                                 # ms of one collective in the draft phase
    off: Mapping[str, tuple[float, float]] | None        # measured steps=0 terms (mean, se)
    settings: tuple[Setting, ...]                        # speculative settings measured
    n_iters: int = 0                                     # settled iterations behind the fit

    def to_json(self) -> dict:
        return {"placement": self.placement, "bs": self.bs, "n_iters": self.n_iters,
                "terms": {k: {"features": list(TERM_COLS[k]), **v.to_json()}
                          for k, v in self.terms.items()},
                "comm": {k: {"features": list(TERM_COLS[k]), **v.to_json()}
                         for k, v in self.comm.items()},
                "comm_per_call_ms": self.comm_per_call,
                "off": None if self.off is None else {k: list(v) for k, v in self.off.items()},
                "settings": [s.to_json() for s in self.settings]}


@dataclass(frozen=True)
class Prediction:
    setting: Setting
    bs: int
    tok_s: float | None          # None: not predictable (see reason)
    sd: float = math.nan
    tau: float = math.nan
    tau_sd: float = math.nan
    t_ms: float = math.nan
    t_sd: float = math.nan
    terms_ms: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    basis: str = "fitted"
    reason: str = ""
    measured_tok_s: float | None = None
    measured_n: int = 0

    def to_json(self) -> dict:
        def num(v: float | None) -> float | None:
            return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 6)
        return {**self.setting.to_json(), "bs": self.bs, "tok_s": num(self.tok_s), "sd": num(self.sd),
                "tau": num(self.tau), "tau_sd": num(self.tau_sd), "t_ms": num(self.t_ms),
                "t_sd": num(self.t_sd),
                "terms_ms": {k: [num(v[0]), num(v[1])] for k, v in self.terms_ms.items()},
                "basis": self.basis, "reason": self.reason,
                "measured_tok_s": num(self.measured_tok_s), "measured_n": self.measured_n}


@dataclass(frozen=True)
class WhatIf:
    """Predicted tok/s if the draft ran outside the TP group (replicated or rank0)."""

    setting: Setting               # the measured (sharded) setting it starts from
    placement: str
    bs: int
    comm_share: float              # collective share of draft + draft_extend time
    tok_s_now: float
    tok_s: float                   # draft compute unchanged (latency-bound small layer)
    tok_s_low: float               # draft compute × tp (compute-bound: no sharding to split it)
    t_ms: float
    assumption: str

    def to_json(self) -> dict:
        return {**self.setting.to_json(), "to_placement": self.placement, "bs": self.bs,
                "comm_share": self.comm_share, "tok_s_now": self.tok_s_now, "tok_s": self.tok_s,
                "tok_s_low": self.tok_s_low, "t_ms": self.t_ms, "assumption": self.assumption}


def _fit_group(placement: str, bs: int, stats: Sequence[SettingStats]) -> GroupFit | None:
    spec = [s for s in stats if s.setting.steps > 0]
    off_stats = [s for s in stats if s.setting.steps == 0]
    terms: dict[str, LinearFit] = {}
    comm: dict[str, LinearFit] = {}
    load = _load_cost(stats)
    if spec:
        for term, cols in TERM_COLS.items():
            if term == PREFILL:
                terms[term] = load
                continue
            x = [features(cols, s.setting) for s in spec]
            terms[term] = fit_linear(cols, x, [s.terms[term][0] for s in spec],
                                     [s.terms[term][1] for s in spec])
        for term in COMM_TERMS:
            if not all(math.isfinite(s.comm[term][0]) for s in spec):
                continue  # collectives not measurable there (inside CUDA graphs): no comm fit
            cols = TERM_COLS[term]
            x = [features(cols, s.setting) for s in spec]
            comm[term] = fit_linear(cols, x, [s.comm[term][0] for s in spec],
                                    [s.comm[term][1] for s in spec])
    timed = [s for s in spec if math.isfinite(s.comm["draft"][0])]
    calls = sum(s.comm_calls.get("draft", 0.0) * s.n for s in timed)
    comm_ms = sum(s.comm["draft"][0] * s.n for s in timed)
    per_call = comm_ms / calls if calls > 0 else 0.0
    off = None
    if off_stats:
        st = max(off_stats, key=lambda s: s.n)
        off = {k: st.terms[k] for k in OFF_TERMS if k in st.terms}
        off[PREFILL] = load.predict([1.0])
    if not terms and off is None:
        return None
    return GroupFit(placement, bs, terms, comm, per_call, off,
                    tuple(sorted({s.setting for s in spec})), sum(s.n for s in stats))


def _load_cost(stats: Sequence[SettingStats]) -> LinearFit:
    """Prefill per iteration as one constant: Σ n·mean / Σ n over the group's settings. Its error
    combines the settings' errors and, when they disagree more than those say, their spread."""
    n = sum(s.n for s in stats)
    pts = [(s.n, *s.terms.get(PREFILL, (0.0, 0.0))) for s in stats]
    mean = sum(k * m for k, m, _ in pts) / n if n else 0.0
    var = sum((k * se) ** 2 for k, _, se in pts) / n ** 2 if n else 0.0
    if len(pts) > 1:
        spread = sum(k * (m - mean) ** 2 for k, m, _ in pts) / n
        var = max(var, spread / (len(pts) - 1))
    rms = math.sqrt(sum(k * (m - mean) ** 2 for k, m, _ in pts) / n) if n else 0.0
    return LinearFit(CONST_COLS, (0,), (mean,), ((var,),), rms, len(pts), 1.0)


@dataclass(frozen=True)
class CostModel:
    groups: Mapping[tuple[str, int], GroupFit]
    acceptance: AcceptanceModel
    stats: tuple[SettingStats, ...]
    tp_size: int | None = None

    # ---- queries -------------------------------------------------------------------------
    def batch_sizes(self) -> list[int]:
        return sorted({bs for _, bs in self.groups})

    def placements(self, bs: int) -> list[str]:
        return sorted({p for p, b in self.groups if b == bs})

    def measured(self, s: Setting, bs: int) -> SettingStats | None:
        for st in self.stats:
            if st.setting == s and st.bs == bs:
                return st
        return None

    def _terms(self, g: GroupFit, s: Setting) -> tuple[dict[str, tuple[float, float]], str] | str:
        """Predicted (mean, sd) per term for s in group g, or a reason it cannot be predicted."""
        if s.steps == 0:
            if g.off is not None:
                return {DRAFT: (0.0, 0.0), DRAFT_EXTEND: (0.0, 0.0), **g.off}, "measured"
            if not g.terms:
                return "nothing measured at this batch size"
            out = {DRAFT: (0.0, 0.0), DRAFT_EXTEND: (0.0, 0.0)}
            for term in OFF_TERMS:
                fit = g.terms[term]
                # The plain decode is the verify line at one token per request.
                x = [1.0 if c in ("1", "N") else 0.0 for c in TERM_COLS[term]]
                m, sd = fit.predict(x)
                out[term] = (max(m, 0.0), math.hypot(sd, 0.25 * abs(m)))
            return out, "extrapolated"
        if not g.terms:
            return "only speculation-off was measured at this batch size"
        out = {}
        for term, fit in g.terms.items():
            x = features(TERM_COLS[term], s)
            if not fit.supports(x):
                return (f"{term} cost was measured at one value of what this setting changes "
                        f"(probe a setting with this topk/steps/N)")
            m, sd = fit.predict(x)
            out[term] = (max(m, 0.0), sd)
        return out, "fitted"

    def predict(self, s: Setting, bs: int) -> Prediction:
        st = self.measured(s, bs)
        meas = {"measured_tok_s": st.tok_per_s if st else None, "measured_n": st.n if st else 0}
        g = self.groups.get((s.placement, bs))
        if g is None:
            w = self._what_if_prediction(s, bs)
            if w is not None:
                return replace(w, **meas)
            return Prediction(s, bs, None, reason=f"placement {s.placement} not measured at bs={bs}",
                              **meas)
        res = self._terms(g, s)
        if isinstance(res, str):
            return Prediction(s, bs, None, reason=res, **meas)
        terms, basis = res
        tau = self.acceptance.tau(s)
        if tau is None:
            return Prediction(s, bs, None, reason="tree acceptance not measured for this topk",
                              **meas)
        return self._combine(s, bs, terms, tau, _weakest(basis, _tau_basis(tau)), meas)

    @staticmethod
    def _combine(s: Setting, bs: int, terms: Mapping[str, tuple[float, float]], tau: TauEstimate,
                 basis: str, meas: Mapping) -> Prediction:
        t = sum(m for m, _ in terms.values())
        t_sd = math.sqrt(sum(sd * sd for _, sd in terms.values()))
        if t <= 0:
            return Prediction(s, bs, None, reason="predicted iteration time is not positive", **meas)
        tok_s = 1000.0 * bs * tau.tau / t
        rel = math.hypot(tau.sd / tau.tau, t_sd / t)
        return Prediction(s, bs, tok_s, tok_s * rel, tau.tau, tau.sd, t, t_sd, dict(terms), basis,
                          **meas)

    def predict_all(self, space: Iterable[Setting], bs: int) -> list[Prediction]:
        return [self.predict(s, bs) for s in space]

    # ---- the "what if the draft left the TP group" readout --------------------------------
    def comm_untimed(self, bs: int) -> bool:
        """The sharded draft was measured at this batch size but its collectives have no time
        (inside CUDA graphs): a what-if cannot be computed, the placement must be measured."""
        g = self.groups.get((SHARDED, bs))
        return g is not None and bool(g.terms) and not all(t in g.comm for t in (DRAFT, DRAFT_EXTEND))

    def what_if(self, s: Setting, bs: int, placement: str = REPLICATED) -> WhatIf | None:
        """From the sharded measurement of s's steps/topk/N: remove the draft's collectives
        (keeping one, the broadcast of draft tokens to the other ranks), keep its compute."""
        if s.steps == 0:
            return None
        g = self.groups.get((SHARDED, bs))
        base = s.__class__(s.steps, s.topk, s.num_draft_tokens, SHARDED)
        if g is None or not g.terms or self.comm_untimed(bs):
            return None  # unmeasured, or the draft's collectives were not timed
        res = self._terms(g, base)
        tau = self.acceptance.tau(base)
        if isinstance(res, str) or tau is None:
            return None
        terms, _ = res
        comm = {}
        for term in (DRAFT, DRAFT_EXTEND):
            fit = g.comm[term]
            x = features(TERM_COLS[term], base)
            comm[term] = max(fit.predict(x)[0], 0.0) if fit.supports(x) else 0.0
        t_now = sum(m for m, _ in terms.values())
        draft_work = terms[DRAFT][0] + terms[DRAFT_EXTEND][0]
        comm_total = min(comm[DRAFT] + comm[DRAFT_EXTEND], draft_work)
        compute = draft_work - comm_total
        keep = g.comm_per_call
        t_new = t_now - draft_work + compute + keep
        scale = self.tp_size or 1
        t_low = t_now - draft_work + compute * scale + keep
        tok_now = 1000.0 * bs * tau.tau / t_now
        assumption = ("the draft's collectives removed (one broadcast of draft tokens kept); "
                      f"its compute unchanged (high) or ×{scale} for the whole layer on one rank (low)")
        if self.tp_size is None:
            assumption += "; TP size unknown, so low = high"
        return WhatIf(base, placement, bs, comm_total / draft_work if draft_work > 0 else 0.0,
                      tok_now, 1000.0 * bs * tau.tau / t_new, 1000.0 * bs * tau.tau / t_low,
                      t_new, assumption)

    def _what_if_prediction(self, s: Setting, bs: int) -> Prediction | None:
        if s.placement == SHARDED or s.steps == 0:
            return None
        w = self.what_if(s, bs, s.placement)
        if w is None:
            return None
        tau = self.acceptance.tau(s)
        assert tau is not None
        base = self.predict(w.setting, bs)
        spread = (w.tok_s - w.tok_s_low) / 2
        sd = math.hypot(base.sd * w.tok_s / base.tok_s if base.tok_s else 0.0, spread)
        return Prediction(s, bs, w.tok_s, sd, tau.tau, tau.sd, w.t_ms, math.nan, {}, "what-if",
                          reason=w.assumption)

    # ---- export -------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"version": 1, "tp_size": self.tp_size,
                "groups": [g.to_json() for _, g in sorted(self.groups.items())],
                "acceptance": self.acceptance.to_json(),
                "measured": [s.to_json() for s in self.stats]}


def _tau_basis(t: TauEstimate) -> str:
    return {"chain": "fitted", "measured": "measured", "off": "measured"}.get(t.basis, "extrapolated")


def fit_cost_model(stats: Sequence[SettingStats], tp_size: int | None = None) -> CostModel:
    """Fit every (placement, bs) group that has measurements, and the acceptance model."""
    by_group: dict[tuple[str, int], list[SettingStats]] = {}
    for st in stats:
        by_group.setdefault((st.setting.placement, st.bs), []).append(st)
    groups = {}
    for key, sts in by_group.items():
        g = _fit_group(key[0], key[1], sts)
        if g is not None:
            groups[key] = g
    return CostModel(groups, fit_acceptance(stats), tuple(stats), tp_size)


def best(predictions: Iterable[Prediction]) -> Prediction | None:
    """The highest predicted tok/s among predictable settings."""
    ok = [p for p in predictions if p.tok_s is not None]
    return max(ok, key=lambda p: p.tok_s) if ok else None  # type: ignore[arg-type,return-value]


def recommend(model: CostModel, space: Sequence[Setting], min_iters: int = 100) -> dict[int, Prediction]:
    """The best setting per batch size measured well enough (≥ min_iters settled iterations in
    its groups: batch sizes seen only while requests came and went say little)."""
    out = {}
    for bs in model.batch_sizes():
        if sum(g.n_iters for (p, b), g in model.groups.items() if b == bs) < min_iters:
            continue
        b = best(model.predict_all(space, bs))
        if b is not None:
            out[bs] = b
    return out


def fit_from_records(records: Iterable[Mapping], tp_size: int | None = None,
                     warmup_iters: int = SETTLE_ITERATIONS, warmup_s: float = SETTLE_S) -> CostModel:
    """Phase-stream records → settled iterations → per-setting stats → fitted model."""
    from tuner.tuning.observations import parse_record, settle, summarise

    iters = settle([parse_record(r) for r in records], warmup_iters, warmup_s)
    return fit_cost_model(summarise(iters), tp_size)
