"""Validation for the plugin's `/set_internal_state` keys: the pinned step tier and the timer lease.

`specdecode_num_steps` pins SGLang's adaptive controller to one of the step tiers it captured
CUDA graphs for at startup (reference §3, §6.4); -1 hands control back to SGLang's own policy.
`specdecode_timers` turns the phase timers on for that many seconds (0 turns them off), so an
unwatched server pays nothing.

Pure functions over plain values: reading SGLang's controller objects is `adaptive_view()`'s job
(duck-typed, attribute names checked by the contract tests). Must not import torch or SGLang.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from probes.names import PINNED_STEPS

PIN_KEY = PINNED_STEPS
TIMERS_KEY = "specdecode_timers"
UNPIN = -1
MAX_LEASE_S = 24 * 3600.0

ADAPTIVE_HINT = (
    "start SGLang with --speculative-adaptive --speculative-eagle-topk 1 "
    "--speculative-adaptive-config <file> whose one batch-size slot lists every step you want, "
    'e.g. {"1": {"candidate_steps": [1, 2, 3, 4, 5]}}'
)


class Refused(ValueError):
    """The server cannot apply the value; the message is the one-line reason."""


@dataclass(frozen=True)
class AdaptiveView:
    """What the adaptive controller offers: steps with captured graphs, candidates per bs slot."""
    captured: frozenset[int]
    slots: tuple[tuple[int, tuple[int, ...]], ...]     # (min batch size, candidate steps), sorted


def adaptive_view(controller: Any) -> AdaptiveView | None:
    """Read SGLang's AdaptiveController (None when the server runs without one)."""
    if controller is None:
        return None
    slots = getattr(getattr(controller, "params", None), "_slots", {}) or {}
    return AdaptiveView(
        captured=frozenset(int(s) for s in getattr(controller, "_states", {})),
        slots=tuple(sorted((int(bs), tuple(sorted(int(c) for c in slot.candidate_steps)))
                           for bs, slot in slots.items())),
    )


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused(f"{key} must be a number, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise Refused(f"{key} must be a whole number of steps, got {value!r}")
    return int(value)


def check_pin(value: Any, view: AdaptiveView | None) -> int | None:
    """The step tier to pin (None = release the pin), or Refused with the reason."""
    n = _whole(PIN_KEY, value)
    if n == UNPIN:
        return None
    if view is None:
        raise Refused(
            f"{PIN_KEY} needs SGLang's adaptive controller, and this server has none "
            f"(not started with --speculative-adaptive, or SGLang turned it off at startup: look for "
            f"'speculative_adaptive disabled' in its log); {ADAPTIVE_HINT}")
    if n < 0:
        raise Refused(f"{PIN_KEY} must be >= 0 (or {UNPIN} to release the pin), got {n}")
    if n not in view.captured:
        raise Refused(
            f"{PIN_KEY}={n} has no CUDA graphs: this server captured steps "
            f"{sorted(view.captured)} at startup; {ADAPTIVE_HINT}")
    missing = [(bs, c) for bs, c in view.slots if n not in c]
    if missing:
        bs, c = missing[0]
        raise Refused(
            f"{PIN_KEY}={n} is not a candidate for batch sizes >= {bs} (candidates {list(c)}), so "
            f"those batch sizes have no graphs for it; {ADAPTIVE_HINT}")
    return n


def check_lease(value: Any) -> float:
    """Seconds the timers stay on from now (0 = off)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Refused(f"{TIMERS_KEY} must be a number of seconds, got {value!r}")
    if value < 0 or value > MAX_LEASE_S:
        raise Refused(f"{TIMERS_KEY} must be between 0 and {MAX_LEASE_S:.0f} seconds, got {value}")
    return float(value)


class StepPin:
    """The pinned tier of one scheduler process; SGLang's policy hooks consult it."""

    def __init__(self) -> None:
        self.steps: int | None = None

    def steps_for_batch(self, policy_steps: int) -> int:
        return policy_steps if self.steps is None else self.steps

    @property
    def pinned(self) -> bool:
        return self.steps is not None


class Lease:
    """Timers on while now < deadline, or always when the server's environment says so."""

    def __init__(self, always: bool = False) -> None:
        self.always = always
        self.deadline = 0.0

    def grant(self, seconds: float, now: float) -> None:
        self.deadline = now + seconds if seconds > 0 else 0.0

    def on(self, now: float) -> bool:
        return self.always or now < self.deadline
