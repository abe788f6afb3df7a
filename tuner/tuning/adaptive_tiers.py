"""Which tier SGLang's adaptive controller chose per batch-size slot, from its log lines.

SGLang 0.5.23 logs its tier moves (tuner.backends.sglang.log.TierLine) without naming the
batch-size slot they belong to: a move happens while the controller routes the *current* batch
(`activate_step_by_batch(bs)` at the start of a decode iteration, `on_verify_complete(..., bs)`
after it; sglang/srt/speculative/adaptive_runtime_state.py:122-135). So each move is put in the
slot of the batch size the nearest decode line reports (`#running-req`), routed as
`probes.adaptive_policy.tier_for` does. That is an estimate: decode lines come every
--decode-log-interval iterations, and SGLang pads the batch size to a CUDA-graph size before
routing, which the log does not say.

`chosen_tiers` is pure (plain values in and out); `chosen_tiers_in` reads the same facts from a
store that managed mode's log feed filled (tuner.backends.sglang.managed.LogFeed: `log/tier_steps`
per switch line, `log/running_reqs` per decode line), live or from a recording. No I/O, no widgets.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple, Protocol

from probes.adaptive_policy import DEFAULT_TIERS, tier_for
from tuner.core import series as S


class TierMove(Protocol):
    """What is read of a tier line (tuner.backends.sglang.log.TierLine)."""

    t: float
    kind: str
    new_steps: int
    new_draft_tokens: int | None


class BatchReading(Protocol):
    """What is read of a decode line (tuner.backends.sglang.log.DecodeLine)."""

    t: float
    running_reqs: int


@dataclass(frozen=True)
class ChosenTier:
    """The newest tier the controller chose for one batch-size slot."""

    slot: int               # the slot's threshold: batches of at least this many requests
    steps: int
    t: float                # when the move was logged
    batch: int              # the batch size it was attributed to (the nearest decode line's)
    moves: int              # tier lines attributed to this slot (a policy move logs two: update, switch)


def chosen_tiers(moves: Iterable[TierMove], batches: Iterable[BatchReading],
                 slots: Mapping[int, object] | Iterable[int] = DEFAULT_TIERS) -> dict[int, ChosenTier]:
    """slot threshold -> its newest chosen tier, for the slots some move was attributed to.

    `slots`: the adaptive config's thresholds (a resolved config or just its keys; SGLang's default
    config when not given). A move with no decode line to attribute it to is left out.
    """
    keys = {int(k): None for k in slots}
    readings = sorted(((b.t, b.running_reqs) for b in batches), key=lambda x: x[0])
    times = [t for t, _ in readings]
    out: dict[int, ChosenTier] = {}
    for m in sorted(moves, key=lambda x: x.t):
        bs = _nearest(times, readings, m.t)
        if bs is None:
            continue
        slot = tier_for(max(1, bs), keys)
        prev = out.get(slot)
        out[slot] = ChosenTier(slot, int(m.new_steps), m.t, bs, (prev.moves if prev else 0) + 1)
    return dict(sorted(out.items()))


def _nearest(times: list[float], readings: list[tuple[float, int]], t: float) -> int | None:
    """The running requests of the decode line nearest in time to `t` (the later one on a tie: a
    move is logged before the iteration's decode line)."""
    if not readings:
        return None
    i = bisect.bisect_left(times, t)
    if i == 0:
        return readings[0][1]
    if i == len(readings):
        return readings[-1][1]
    before, after = readings[i - 1], readings[i]
    return after[1] if after[0] - t <= t - before[0] else before[1]


class _Move(NamedTuple):
    t: float
    kind: str
    new_steps: int
    new_draft_tokens: int | None


class _Batch(NamedTuple):
    t: float
    running_reqs: int


def chosen_tiers_in(store: Any, t0: float = -math.inf, t1: float = math.inf,
                    slots: Mapping[int, object] | Iterable[int] = DEFAULT_TIERS) -> dict[int, ChosenTier]:
    """`chosen_tiers` over the log readings a store holds between t0 and t1."""
    tiers = store.window(S.LOG_TIER_STEPS, t0, t1)
    running = store.window(S.LOG_RUNNING, t0, t1)
    moves = [_Move(t, "switch", int(v), None) for t, v in zip(tiers.t, tiers.v) if not math.isnan(v)]
    batches = [_Batch(t, int(v)) for t, v in zip(running.t, running.v) if not math.isnan(v)]
    return chosen_tiers(moves, batches, slots)
