"""SGLang 0.5.23's acceptance-only adaptive steps, re-implemented for comparison.

SGLang keeps, per batch-size tier, an EMA of the correct drafts per request and moves num_steps
among the tier's candidate steps by that EMA alone (target ≈ round(EMA)+1 with hysteresis); it
never looks at what a step costs. `acceptance_only_pick` runs that policy on our measured
acceptance to say which step SGLang's adaptive mode would settle on, so the tuner can show what
knowing the costs buys. Behaviour follows the reference notes (adaptive_spec_params.py: warm-up,
update interval, down-first then up, steps 0 always probes upwards). Pure logic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from tuner.tuning.acceptance import AcceptanceModel

# SGLang's DEFAULT_ADAPTIVE_CONFIG: batch-size threshold -> candidate steps (+ per-tier knobs).
DEFAULT_TIERS: dict[int, dict] = {
    1: {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    8: {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    32: {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    64: {"candidate_steps": [0], "down_hysteresis": 0.0},
}


@dataclass
class AdaptiveSlot:
    """One tier's state: the EMA of correct drafts per request and the current step."""

    candidate_steps: Sequence[int]
    current_steps: int
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ema: float = field(init=False)
    batches: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.candidate_steps = sorted(set(self.candidate_steps))
        if self.current_steps not in self.candidate_steps:
            self.current_steps = self.candidate_steps[len(self.candidate_steps) // 2]
        self.ema = float(self.current_steps - 1)

    def update(self, correct_drafts: Sequence[float]) -> bool:
        """Feed one verify's correct drafts per request; True when the step changed."""
        if not correct_drafts:
            return False
        if self.current_steps > 0:
            mean = sum(correct_drafts) / len(correct_drafts)
            self.ema = (1 - self.ema_alpha) * self.ema + self.ema_alpha * mean
        self.batches += 1
        if self.batches <= self.warmup_batches:
            return False
        if (self.batches - self.warmup_batches) % self.update_interval:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        cands = list(self.candidate_steps)
        old = self.current_steps
        i = cands.index(old)
        if old == 0:
            i = min(i + 1, len(cands) - 1)
            if cands[i] > 0 and self.ema < 0:
                self.ema = float(cands[i] - 1)
        else:
            start = i
            while i > 0:
                prev = cands[i - 1]
                threshold = (0.5 if prev == 0 else prev - 0.5) + self.down_hysteresis
                if self.ema <= threshold:
                    i -= 1
                else:
                    break
            if i == start:
                while i < len(cands) - 1 and self.ema > cands[i] - 0.5 + self.up_hysteresis:
                    i += 1
        self.current_steps = cands[i]
        return self.current_steps != old


def tier_for(bs: int, tiers: Mapping[int, dict]) -> int:
    """The largest tier threshold ≤ bs (SGLang pads bs to a CUDA-graph size first; we do not)."""
    keys = sorted(tiers)
    chosen = keys[0]
    for k in keys:
        if k <= bs:
            chosen = k
    return chosen


def acceptance_only_pick(acc: AcceptanceModel, bs: int, tiers: Mapping[int, dict] = DEFAULT_TIERS,
                         initial_steps: int | None = None, batches: int = 400,
                         seed: int | None = 0) -> int:
    """The step SGLang's adaptive policy would settle on for this acceptance and batch size.

    Each simulated verify draws bs requests' correct drafts from the measured chain acceptance,
    truncated at the current step; returns the step held most often in the second half (the
    policy can oscillate between two candidates when the EMA sits on a threshold).
    """
    cfg = dict(tiers[tier_for(bs, tiers)])
    cands = cfg.pop("candidate_steps")
    slot = AdaptiveSlot(cands, initial_steps if initial_steps is not None else -1,
                        **{k: v for k, v in cfg.items() if k in (
                            "ema_alpha", "update_interval", "warmup_batches",
                            "down_hysteresis", "up_hysteresis")})
    rng = random.Random(seed)
    held: dict[int, int] = {}
    for b in range(batches):
        s = slot.current_steps
        if s == 0:
            drafts = [0.0] * bs
        elif seed is None:
            drafts = [acc.chain_tau(s).tau - 1.0] * bs       # expected value, no noise
        else:
            drafts = [float(_draw(acc, s, rng)) for _ in range(bs)]
        slot.update(drafts)
        if b >= batches // 2:
            held[slot.current_steps] = held.get(slot.current_steps, 0) + 1
    return max(held, key=lambda k: (held[k], k))


def _draw(acc: AcceptanceModel, steps: int, rng: random.Random) -> int:
    """Correct drafts of one request at this depth: walk the conditional acceptances."""
    alphas = acc.alpha
    j = 0
    while j < steps:
        a = alphas[j] if j < len(alphas) else (alphas[-1] if alphas else 0.0)
        if rng.random() >= a:
            break
        j += 1
    return j
