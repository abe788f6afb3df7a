"""Acceptance as the design note defines it: per-position acceptance p_k from the correct-drafts
histogram, conditional α_k = p_k / p_{k-1}, and the accept length τ(s) = 1 + Σ_{k≤s} p_k.

Chains (topk=1): greedy drafts along the chain do not depend on how deep the chain goes, so a
verify round at depth s tells P(accepted ≥ k) for every k ≤ s; p_k pools every chain measurement
deep enough to see position k (the deepest probe sees them all). Trees (topk>1): τ is taken from
the tree's own measurement; an unmeasured tree with a measured sibling of the same topk is scaled
from it (flagged "extrapolated", wider error); a tree with no measured sibling is not predicted.
Pure functions over `SettingStats`; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from probes.names import R_DRAFT_TOKENS
from tuner.tuning.observations import SettingStats
from tuner.tuning.settings import Setting


@dataclass(frozen=True)
class TauEstimate:
    tau: float
    sd: float
    basis: str   # "chain" | "measured" | "extrapolated" | "off"


@dataclass(frozen=True)
class AcceptanceModel:
    p: tuple[float, ...]            # p[k-1] = P(accepted ≥ k), k = 1..depth
    n: tuple[int, ...]              # verify rounds that could see position k
    trees: Mapping[tuple[int, int, int], tuple[float, float, int]]  # (s,k,N) -> (τ, se, rounds)

    @property
    def depth(self) -> int:
        return len(self.p)

    @property
    def alpha(self) -> tuple[float, ...]:
        """Conditional acceptance α_k = p_k / p_{k-1} (p_0 = 1)."""
        out, prev = [], 1.0
        for pk in self.p:
            out.append(pk / prev if prev > 0 else 0.0)
            prev = pk
        return tuple(out)

    def chain_tau(self, steps: int) -> TauEstimate:
        if steps == 0:
            return TauEstimate(1.0, 0.0, "off")
        if self.depth == 0:
            raise LookupError("no chain acceptance measured")
        tau, sd = 1.0, 0.0
        for k in range(1, min(steps, self.depth) + 1):
            pk, nk = self.p[k - 1], self.n[k - 1]
            tau += pk
            # Positions share verify rounds, so their errors add linearly (an upper bound).
            sd += math.sqrt(max(pk * (1 - pk), 0.25 / max(nk, 1)) / max(nk, 1))
        if steps <= self.depth:
            return TauEstimate(tau, sd, "chain")
        # Beyond the deepest measurement: continue with the last conditional acceptance.
        a = self.alpha[-1] if self.depth else 0.0
        pk = self.p[-1]
        extra = 0.0
        for _ in range(steps - self.depth):
            pk *= a
            extra += pk
        return TauEstimate(tau + extra, sd + extra, "extrapolated")

    def tau(self, s: Setting) -> TauEstimate | None:
        """τ for a setting, or None when nothing measured supports it."""
        if s.steps == 0:
            return TauEstimate(1.0, 0.0, "off")
        if s.topk == 1:
            return self.chain_tau(s.steps) if self.depth else None
        key = (s.steps, s.topk, s.num_draft_tokens)
        if key in self.trees:
            tau, se, _ = self.trees[key]
            return TauEstimate(tau, se, "measured")
        siblings = [(k, v) for k, v in self.trees.items() if k[1] == s.topk]
        if not siblings or not self.depth:
            return None
        # Nearest measured tree of the same topk, scaled by the chain's depth profile.
        (ss, _, sn), (stau, sse, _) = min(
            siblings, key=lambda kv: abs(kv[0][0] - s.steps) + abs(kv[0][2] - s.num_draft_tokens))
        ratio = stau / self.chain_tau(ss).tau
        base = self.chain_tau(s.steps)
        cap = 1.0 + min(s.steps, s.num_draft_tokens - 1)
        tau = min(base.tau * ratio, cap)
        sd = math.hypot(base.sd * ratio + sse, 0.5 * abs(tau - base.tau))
        return TauEstimate(tau, sd, "extrapolated")

    def to_json(self) -> dict:
        return {"p": list(self.p), "alpha": list(self.alpha), "n": list(self.n),
                "tau_chain": {str(s): [self.chain_tau(s).tau, self.chain_tau(s).sd]
                              for s in range(0, self.depth + 1)},
                "trees": [{"steps": k[0], "topk": k[1], R_DRAFT_TOKENS: k[2],
                           "tau": v[0], "se": v[1], "rounds": v[2]}
                          for k, v in sorted(self.trees.items())]}


def fit_acceptance(stats: Sequence[SettingStats]) -> AcceptanceModel:
    """Pool chain histograms into p_k; keep each tree's own τ."""
    depth = max((s.setting.steps for s in stats if s.setting.topk == 1), default=0)
    at_least = [0] * depth
    seen = [0] * depth
    trees_acc: dict[tuple[int, int, int], list[int]] = {}
    for st in stats:
        s = st.setting
        if s.steps == 0:
            continue
        if s.topk == 1:
            rounds = sum(st.accepted_hist)
            for k in range(1, s.steps + 1):
                seen[k - 1] += rounds
                at_least[k - 1] += sum(st.accepted_hist[k:])
        else:
            key = (s.steps, s.topk, s.num_draft_tokens)
            agg = trees_acc.setdefault(key, [])
            if len(agg) < len(st.accepted_hist):
                agg.extend([0] * (len(st.accepted_hist) - len(agg)))
            for j, c in enumerate(st.accepted_hist):
                agg[j] += c
    # Stop at the first position nobody could observe (a probe plan with gaps).
    p: list[float] = []
    n: list[int] = []
    for k in range(depth):
        if seen[k] == 0:
            break
        p.append(at_least[k] / seen[k])
        n.append(seen[k])
    trees: dict[tuple[int, int, int], tuple[float, float, int]] = {}
    for key, hist in trees_acc.items():
        rounds = sum(hist)
        if rounds == 0:
            continue
        mean = sum(j * c for j, c in enumerate(hist)) / rounds
        var = sum(c * (j - mean) ** 2 for j, c in enumerate(hist)) / max(rounds - 1, 1)
        trees[key] = (1.0 + mean, math.sqrt(var / rounds) if rounds > 1 else 0.5, rounds)
    return AcceptanceModel(tuple(p), tuple(n), trees)


def acceptance_from_p(p: Sequence[float], rounds: int = 10_000,
                      trees: Mapping[tuple[int, int, int], tuple[float, float, int]] | None = None
                      ) -> AcceptanceModel:
    """An acceptance model from known p_k (for predictions from published or simulated numbers)."""
    return AcceptanceModel(tuple(p), tuple([rounds] * len(p)), dict(trees or {}))
