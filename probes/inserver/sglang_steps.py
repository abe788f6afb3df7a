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
from typing import Any, Callable, Iterable

from probes.adaptive_policy import KNOB_DEFAULTS   # SGLang's per-slot knobs, one list
from probes.names import PINNABLE_STEPS, PINNED_STEPS
from probes.sglang_tiers import coverage

PIN_KEY = PINNED_STEPS
PINNABLE_KEY = PINNABLE_STEPS
TIMERS_KEY = "specdecode_timers"
UNPIN = -1
MAX_LEASE_S = 24 * 3600.0

ADAPTIVE_HINT = (
    "`specdecode-tune sglang-flags --from URL --steps 1,2,3` writes an adaptive config whose every "
    "batch-size slot lists the steps you want, and the flags to relaunch with"
)


class Refused(ValueError):
    """The server cannot apply the value; the message is the one-line reason."""


@dataclass(frozen=True)
class AdaptiveView:
    """What the adaptive controller offers: steps with captured graphs, candidates per bs slot, the
    launch's tier (registered first, with graphs at every batch size) and the captured graph sizes
    (None: CUDA graphs off, so every tier runs eagerly anywhere)."""
    captured: frozenset[int]
    slots: tuple[tuple[int, tuple[int, ...]], ...]     # (min batch size, candidate steps), sorted
    launch: int | None = None
    graph_bs: tuple[int, ...] | None = None
    knobs: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()   # per slot, SGLang's knobs




def adaptive_view(controller: Any) -> AdaptiveView | None:
    """Read SGLang's AdaptiveController (None when the server runs without one)."""
    if controller is None:
        return None
    params = getattr(controller, "params", None)
    slots = getattr(params, "_slots", {}) or {}
    states = getattr(controller, "_states", {}) or {}
    graph_bs = getattr(params, "_cuda_graph_bs", None)
    return AdaptiveView(
        captured=frozenset(int(s) for s in states),
        slots=tuple(sorted((int(bs), tuple(sorted(int(c) for c in slot.candidate_steps)))
                           for bs, slot in slots.items())),
        # dicts keep insertion order: init_cuda_graphs registers the launch's state before
        # init_states builds the others (eagle_worker_v2.py:1390-1413)
        launch=next((int(s) for s in states), None),
        graph_bs=None if graph_bs is None else tuple(int(b) for b in graph_bs),
        knobs=tuple(sorted((int(bs), tuple((k, getattr(slot, k)) for k in KNOB_DEFAULTS if hasattr(slot, k)))
                           for bs, slot in slots.items())),
    )


def coverage_of(view: AdaptiveView, max_bs: int, candidates_at: Callable[[int], Iterable[int]]
                ) -> dict[int, list[list[int]]]:
    """Batch sizes 1..max_bs where each captured tier can be pinned (sglang_tiers.coverage), with
    `candidates_at` SGLang's own routing."""
    return coverage(candidates_at, view.captured, view.launch, view.graph_bs is not None, max_bs)


def pinnable_info(view: AdaptiveView | None, max_bs: int,
                  candidates_at: Callable[[int], Iterable[int]]) -> dict[str, Any] | None:
    """What the plugin publishes in `internal_states[i]` under PINNABLE_KEY (None: no controller).

    steps: {tier: [[lo, hi], ...]} where the pin holds (bs 1..max_bs, the slots above never run);
    slots: each slot's candidates and knobs, so a config can be rebuilt from a running server."""
    if view is None:
        return None
    cover = coverage_of(view, max_bs, candidates_at)
    knobs = dict(view.knobs)
    return {
        "max_bs": int(max_bs), "launch": view.launch,
        "graph_bs": None if view.graph_bs is None else list(view.graph_bs),
        "steps": {str(s): r for s, r in sorted(cover.items()) if r},
        "slots": [{"bs": bs, "candidate_steps": list(c), **dict(knobs.get(bs, ()))} for bs, c in view.slots],
    }


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused(f"{key} must be a number, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise Refused(f"{key} must be a whole number of steps, got {value!r}")
    return int(value)


def check_pin(value: Any, view: AdaptiveView | None,
              cover: dict[int, list[list[int]]] | None = None) -> int | None:
    """The step tier to pin (None = release the pin), or Refused with the reason.

    A tier is pinnable when it has graphs at some batch size the server runs (`cover`, from
    coverage_of); at the others SGLang's policy keeps running, and the records say so."""
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
    if cover is not None and not cover.get(n):
        slots = [f"bs >= {bs}" for bs, c in view.slots if n in c]
        raise Refused(
            f"{PIN_KEY}={n} never runs here: only slots {', '.join(slots) or 'none'} list it, and no batch "
            f"size this server runs routes there; {ADAPTIVE_HINT}")
    return n


def pin_holds(pin: int, launch: int | None, graphs: bool, candidates: Iterable[int]) -> bool:
    """Whether a pinned tier runs at a batch whose slot lists `candidates` (see coverage)."""
    return pin == launch or not graphs or pin in candidates


def check_lease(value: Any) -> float:
    """Seconds the timers stay on from now (0 = off)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Refused(f"{TIMERS_KEY} must be a number of seconds, got {value!r}")
    if value < 0 or value > MAX_LEASE_S:
        raise Refused(f"{TIMERS_KEY} must be between 0 and {MAX_LEASE_S:.0f} seconds, got {value}")
    return float(value)


class StepPin:
    """The pinned tier of one scheduler process; SGLang's policy hooks consult it.

    The pin holds at a batch size whose slot lists its tier (or at any, for the launch's tier or
    without CUDA graphs); elsewhere SGLang's policy picks, since no graphs exist for the tier there.
    `held` says what the last routed batch did."""

    def __init__(self) -> None:
        self.steps: int | None = None
        self.launch: int | None = None
        self.graphs = True
        self.held = False

    def steps_for_batch(self, policy_steps: int, candidates: Iterable[int] = ()) -> int:
        self.held = self.steps is not None and pin_holds(self.steps, self.launch, self.graphs, candidates)
        return self.steps if self.held else policy_steps  # type: ignore[return-value]

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
