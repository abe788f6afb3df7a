"""SGLang 0.5.23's acceptance-only adaptive steps (`--speculative-adaptive`), once for every user.

The reference engine runs this policy as its controller; the tuner runs it on measured acceptance
to say which step SGLang's adaptive mode would settle on. Reference notes §3
(adaptive_spec_params.py): a config maps batch-size thresholds to a tier's candidate steps; each
tier keeps an EMA of the correct drafts per request and, after `warmup_batches`, every
`update_interval` batches moves down (first) or up among its candidates with hysteresis; at steps 0
it always probes upwards. It never looks at what a step costs.

Standard library only (an import-linter contract checks it): it loads in the engine's ranks, its
HTTP process and the tuner alike. Pure logic, no I/O: a config file is read by probes.json_file.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

# SGLang's per-slot knobs and their defaults (adaptive_spec_params.py :171-176).
KNOB_DEFAULTS: dict[str, float] = {
    "ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10,
    "down_hysteresis": -0.25, "up_hysteresis": 0.0, "ceiling_coeff": 0.0,
}
_INT_KNOBS = ("update_interval", "warmup_batches")

# SGLang's DEFAULT_ADAPTIVE_CONFIG: batch-size threshold -> candidate steps (+ per-tier knobs).
DEFAULT_TIERS: dict[int, dict] = {
    1: {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    8: {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    32: {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    64: {"candidate_steps": [0], "down_hysteresis": 0.0},
}

UNPIN = -1
"""`specdecode_num_steps` = -1 hands the tier back to the policy (the SGLang plugin's value)."""


class AdaptiveConfigError(ValueError):
    """A config or a pin the policy cannot run; the message is one line saying why."""


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


# -- configs ---------------------------------------------------------------------------------------
def _number(where: str, key: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AdaptiveConfigError(f"{where}{key} must be a number, got {value!r:.80}")
    if key in _INT_KNOBS:
        if int(value) != value or value < (1 if key == "update_interval" else 0):
            raise AdaptiveConfigError(f"{where}{key} must be a whole number >= "
                                      f"{1 if key == 'update_interval' else 0}, got {value!r:.80}")
        return int(value)
    if key == "ema_alpha" and not 0 < value <= 1:
        raise AdaptiveConfigError(f"{where}ema_alpha must be in (0, 1], got {value!r:.80}")
    if key == "ceiling_coeff" and value != 0:
        # Its semantics are not in our reference notes; running it wrongly would be worse than saying so.
        raise AdaptiveConfigError(f"{where}ceiling_coeff other than 0 is not supported here, got {value!r:.80}")
    return float(value)


# Far more than any schedule needs (SGLang's default has 4 tiers of 2-3 candidates); past them a
# config is refused, live or from a file: 300 000 tiers made every /metrics scrape take 15 s.
MAX_TIERS = 64
MAX_CANDIDATES = 32


def parse_config(raw: Any) -> dict[int, dict]:
    """SGLang's adaptive config (integer-string batch-size thresholds -> {"candidate_steps": [...]}
    plus optional knobs, per tier or at the top level for every tier) -> {threshold: resolved tier},
    each tier with its candidates sorted and every knob filled in (a tier's own value wins).

    Raises:
        AdaptiveConfigError: one line naming the key that is wrong.
    """
    if not isinstance(raw, dict):
        raise AdaptiveConfigError(
            'expected a JSON object of batch-size thresholds, e.g. {"1": {"candidate_steps": [1, 3]}}')
    if len(raw) > MAX_TIERS + len(KNOB_DEFAULTS):      # before the walk: a refusal costs nothing
        raise AdaptiveConfigError(f"{len(raw)} keys: at most {MAX_TIERS} batch-size thresholds are taken")
    top: dict[str, Any] = {}
    entries: dict[int, dict] = {}
    for key, value in raw.items():
        if key in KNOB_DEFAULTS:
            top[key] = _number("", key, value)
            continue
        try:
            bs = int(key)
        except (TypeError, ValueError):
            raise AdaptiveConfigError(
                f"unknown key {key!r:.80}: keys are batch-size thresholds (\"1\", \"8\", ...) or "
                f"{', '.join(KNOB_DEFAULTS)}") from None
        if str(bs) != str(key).strip() or bs < 1:
            raise AdaptiveConfigError(f"batch-size threshold {key!r:.80} must be a whole number >= 1")
        if not isinstance(value, dict):
            raise AdaptiveConfigError(f'threshold {key}: expected {{"candidate_steps": [...]}}, got {value!r:.80}')
        where = f"threshold {key}: "
        entry: dict[str, Any] = {}
        for k, v in value.items():
            if k == "candidate_steps":
                if isinstance(v, list) and len(v) > MAX_CANDIDATES:
                    raise AdaptiveConfigError(f"{where}{len(v)} candidate_steps: at most {MAX_CANDIDATES} are taken")
                if (not isinstance(v, list) or not v
                        or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in v)):
                    raise AdaptiveConfigError(f"{where}candidate_steps must be a non-empty list of "
                                              f"whole numbers >= 0, got {v!r:.80}")
                entry[k] = sorted(set(v))
            elif k in KNOB_DEFAULTS:
                entry[k] = _number(where, k, v)
            else:
                raise AdaptiveConfigError(f"{where}unknown key {k!r:.80}; a tier takes candidate_steps and "
                                          f"{', '.join(KNOB_DEFAULTS)}")
        if "candidate_steps" not in entry:
            raise AdaptiveConfigError(f"{where}candidate_steps is missing")
        entries[bs] = entry
    if len(entries) > MAX_TIERS:
        raise AdaptiveConfigError(f"{len(entries)} batch-size thresholds: at most {MAX_TIERS} are taken")
    if not entries:
        raise AdaptiveConfigError('no batch-size thresholds: expected e.g. {"1": {"candidate_steps": [1, 3]}}')
    return {bs: {**KNOB_DEFAULTS, **top, **e} for bs, e in sorted(entries.items())}


def default_config() -> dict[int, dict]:
    """SGLang's default config, resolved (what --speculative-adaptive runs without a file)."""
    return parse_config({str(k): v for k, v in DEFAULT_TIERS.items()})


def config_json(tiers: Mapping[int, dict]) -> dict[str, dict]:
    """A resolved config in SGLang's JSON shape (string thresholds), as servers report it."""
    return {str(bs): {"candidate_steps": list(t["candidate_steps"]),
                      **{k: t[k] for k in KNOB_DEFAULTS if k in t}} for bs, t in sorted(tiers.items())}


def all_candidates(tiers: Mapping[int, dict]) -> list[int]:
    """Every step some tier can run (SGLang captures graphs for each of them)."""
    return sorted({c for t in tiers.values() for c in t["candidate_steps"]})


def initial_steps(tiers: Mapping[int, dict], steps: int | None) -> int:
    """The starting step: `steps` when given (it must be a candidate, as in SGLang), else the middle
    candidate of the smallest threshold's tier."""
    if steps is None:
        first = tiers[min(tiers)]["candidate_steps"]
        return first[len(first) // 2]
    if steps not in all_candidates(tiers):
        raise AdaptiveConfigError(f"speculative_num_steps {steps} must be one of the adaptive candidate "
                                  f"steps {all_candidates(tiers)}")
    return steps


def check_pin(value: int, tiers: Mapping[int, dict]) -> int | None:
    """The tier to pin (None = release the pin, UNPIN), as the SGLang plugin checks it: a step every
    tier has among its candidates."""
    if value == UNPIN:
        return None
    if value < 0:
        raise AdaptiveConfigError(f"specdecode_num_steps must be >= 0 (or {UNPIN} to release the pin), "
                                  f"got {value}")
    for bs, t in sorted(tiers.items()):
        if value not in t["candidate_steps"]:
            raise AdaptiveConfigError(
                f"specdecode_num_steps={value} is not a candidate for batch sizes >= {bs} (candidates "
                f"{list(t['candidate_steps'])}); install a speculative_adaptive_config that lists it")
    return value


class Schedule:
    """The controller's state: one slot per tier, the tier for a batch size, the pin.

    `steps_for(bs)` is asked when an iteration is launched; `feed(bs, correct_drafts)` when its
    results are read (so, with an overlapped schedule, the feedback lags one iteration, as in
    SGLang). Deterministic: every rank fed the same results makes the same choices."""

    def __init__(self, tiers: Mapping[int, dict], steps: int, pinned: int | None = None) -> None:
        self.tiers = {int(k): dict(v) for k, v in tiers.items()}
        self.slots = {bs: AdaptiveSlot(t["candidate_steps"], steps,
                                       **{k: t[k] for k in ("ema_alpha", "update_interval", "warmup_batches",
                                                            "down_hysteresis", "up_hysteresis") if k in t})
                      for bs, t in self.tiers.items()}
        self.pinned = pinned

    def steps_for(self, bs: int) -> int:
        if self.pinned is not None:
            return self.pinned
        return self.slots[tier_for(bs, self.tiers)].current_steps

    def feed(self, bs: int, correct_drafts: Sequence[float]) -> bool:
        """One verify's correct drafts per request, for the tier of its batch size; True when that
        tier's step changed. While pinned nothing moves (nor the EMA, which would resume from a state
        measured at a tier the policy did not choose), as with the SGLang plugin's pin."""
        if self.pinned is not None:
            return False
        return self.slots[tier_for(bs, self.tiers)].update(correct_drafts)


# -- what SGLang's policy would pick, on a measured acceptance --------------------------------------
class _Tau(Protocol):
    tau: float


class Acceptance(Protocol):
    """What the simulation needs of an acceptance model: conditional acceptance per position and
    the chain's expected accept length."""

    @property
    def alpha(self) -> Sequence[float]: ...

    def chain_tau(self, steps: int) -> _Tau: ...


def acceptance_only_pick(acc: Acceptance, bs: int, tiers: Mapping[int, dict] = DEFAULT_TIERS,
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


def _draw(acc: Acceptance, steps: int, rng: random.Random) -> int:
    """Correct drafts of one request at this depth: walk the conditional acceptances."""
    alphas = acc.alpha
    j = 0
    while j < steps:
        a = alphas[j] if j < len(alphas) else (alphas[-1] if alphas else 0.0)
        if rng.random() >= a:
            break
        j += 1
    return j


# -- the one writer of SGLang's config --------------------------------------------------------------
def write_config(slots: Mapping[int, Sequence[int]], knobs: Mapping[int, Mapping[str, float]] | None = None,
                 top: Mapping[str, float] | None = None) -> dict[str, Any]:
    """SGLang's `--speculative-adaptive-config` JSON: top-level knobs (every slot's default), then one
    entry per batch-size threshold with its candidate steps and its own knobs. Every config this
    project writes goes through here (`launch --pin-steps`, the schedule export, `sglang-flags`), and
    is checked by parse_config before it leaves (AdaptiveConfigError in one line)."""
    out: dict[str, Any] = {k: v for k, v in (top or {}).items()}
    for bs, cands in sorted(slots.items()):
        entry: dict[str, Any] = {"candidate_steps": sorted({int(c) for c in cands})}
        entry.update((knobs or {}).get(bs, {}))
        out[str(int(bs))] = entry
    parse_config(out)
    return out
