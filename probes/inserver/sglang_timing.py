"""Per-iteration phase timing from device events, resolved lazily, for the SGLang plugin.

The plugin's hooks mark the start and end of each EAGLE phase with events recorded on the
current stream; nothing here ever waits for the device. An iteration becomes a phase-stream
record only once its last event reports completion (`query()`), a few iterations later, and
once the scheduler has handed over its per-request accepted-draft counts (or gave up waiting).

Pure bookkeeping: the event factory is injected (torch.cuda.Event in a GPU server, HostEvent on
a CPU device), so this module imports neither torch nor SGLang. It must not block, sleep, or
synchronize a device.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

# The phase stream's phases (probes.names); `other` is wall minus the rest.
from probes.names import (DRAFT, DRAFT_EXTEND, KNOB_RECORD_KEYS, OTHER, PREFILL, R_ACCEPTED, R_ADAPTIVE, R_BS,
                          R_COMMITTED, R_CTX, R_DRAFT_TOKENS, R_EMULATED_COMM, R_EPOCH, R_PHASE_MS, R_PINNED,
                          R_PLACEMENT, R_RANK, R_SEQ, R_SIMULATED, R_STEPS, R_T, R_WALL_MS, SHARDED, VERIFY,
                          VERIFY_SAMPLE)

PER_BATCH_KNOBS = frozenset({R_STEPS, R_DRAFT_TOKENS})
"""The knobs (record keys) an adaptive controller picks per batch: not part of a config epoch then."""

# Marks the hooks open. `verify_all` is the whole EAGLEWorkerV2.verify call and `target_verify`
# the target forward inside it, so verify_sample = verify_all - target_verify.
MARKS = ("draft", "verify_all", "target_verify", "draft_extend")


class Event(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: "Event") -> float: ...  # milliseconds, like torch.cuda.Event


class HostEvent:
    """An event on the host clock, for CPU devices where work is done when the call returns."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.t - self.t) * 1e3


class EventPool:
    """Reuses events: creating a CUDA event costs more than recording one."""

    def __init__(self, make_event: Callable[[], Event], keep: int = 256) -> None:
        self._make = make_event
        self._free: list[Event] = []
        self._keep = keep

    def recorded(self) -> Event:
        ev = self._free.pop() if self._free else self._make()
        ev.record()
        return ev

    def give_back(self, events: list[Event]) -> None:
        room = self._keep - len(self._free)
        if room > 0:
            self._free.extend(events[:room])


@dataclass
class _Iteration:
    seq: int
    meta: dict[str, Any]
    start: Event
    end: Event | None = None
    t_end: float = 0.0
    spans: list[tuple[str, Event, Event | None]] = field(default_factory=list)
    accepted: list[int] | None = None
    polls_waited: int = 0


def compose_phases(marks_ms: dict[str, float], wall_ms: float) -> dict[str, float]:
    """Phase times of one iteration from the summed mark durations (ms).

    Without a target-forward mark (a hook that did not fire) the whole verify call counts as
    `verify`. `other` is what the iteration spent outside the hooked calls, never negative.
    `prefill` is 0: EXTEND batches run outside the timed decode iterations and are not timed yet
    (the contract: the plugin reports 0 until it times them).
    """
    verify_all = marks_ms.get("verify_all", 0.0)
    target = marks_ms.get("target_verify")
    if target is None or target > verify_all:
        target = verify_all
    out = {
        PREFILL: 0.0,
        DRAFT: marks_ms.get("draft", 0.0),
        VERIFY: target,
        VERIFY_SAMPLE: verify_all - target,
        DRAFT_EXTEND: marks_ms.get("draft_extend", 0.0),
    }
    out[OTHER] = max(0.0, wall_ms - out[DRAFT] - verify_all - out[DRAFT_EXTEND])
    return out


class PhaseTimeline:
    """Open iterations and spans as the hooks fire; `poll()` returns finished records.

    One instance per scheduler process, used from the scheduler thread only.
    """

    def __init__(self, make_event: Callable[[], Event], *, rank: int = 0,
                 accept_wait: int = 4, max_pending: int = 64,
                 clock: Callable[[], float] = time.time) -> None:
        self.pool = EventPool(make_event)
        self.rank = rank
        self.accept_wait = accept_wait      # polls to wait for accepted counts before giving up
        self.max_pending = max_pending
        self.clock = clock
        self.seq = 0
        self.epoch = 0
        self.dropped = 0
        self._last_config: tuple | None = None
        self._current: _Iteration | None = None
        self._pending: deque[_Iteration] = deque()

    @property
    def active(self) -> bool:
        return self._current is not None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def begin(self, **meta: Any) -> None:
        """Start an iteration; meta carries bs, the knobs it runs under their record keys
        (names.KNOB_RECORD_KEYS: steps, topk, num_draft_tokens, placement, ...; a knob not given is
        left out of the record), ctx (each request's context length, in batch order), controller
        (the server runs an adaptive controller) and adaptive (the controller chose these steps:
        false while a tier is pinned).

        A new configuration is a new epoch, except that the steps an adaptive controller picks per
        batch are not (the contract: tier switches keep the epoch; each record says what it ran).
        Operator changes under adaptive (the step pin) call `operator_change()`.
        """
        if self._current is not None:       # the previous one raised mid-way: forget it
            self._current = None
        controlled = bool(meta.get("controller", meta.get("adaptive")))
        config = (*(None if controlled and key in PER_BATCH_KNOBS else meta.get(key)
                    for key in KNOB_RECORD_KEYS.values()), controlled)
        if self._last_config is not None and config != self._last_config:
            self.epoch += 1
        self._last_config = config
        self.seq += 1
        self._current = _Iteration(self.seq, {**meta, "epoch": self.epoch}, self.pool.recorded())

    def update(self, **meta: Any) -> None:
        """Correct the current iteration's meta once the worker has chosen its tier (same epoch)."""
        if self._current is not None:
            self._current.meta.update(meta)

    def operator_change(self) -> None:
        """Someone changed the configuration (not the controller): later records get a new epoch."""
        self.epoch += 1

    def open(self, mark: str) -> int:
        """Record a span start inside the current iteration; returns a handle for close()."""
        it = self._current
        if it is None:
            return -1
        it.spans.append((mark, self.pool.recorded(), None))
        return len(it.spans) - 1

    def close(self, handle: int) -> None:
        it = self._current
        if it is None or handle < 0 or handle >= len(it.spans):
            return
        mark, start, _ = it.spans[handle]
        it.spans[handle] = (mark, start, self.pool.recorded())

    def end(self) -> None:
        it = self._current
        if it is None:
            return
        self._current = None
        it.end = self.pool.recorded()
        it.t_end = self.clock()
        self._pending.append(it)
        while len(self._pending) > self.max_pending:
            self._pending.popleft()         # never completes (device hung?): stop holding it
            self.dropped += 1

    def abandon(self) -> None:
        """The hooked call raised: the iteration is not a measurement."""
        self._current = None

    def accepted(self, per_request: list[int]) -> None:
        """Correct drafts per request of the oldest ended iteration still waiting for them.

        The scheduler reports them in batch order, one iteration late under overlap scheduling;
        an older waiting iteration whose batch size does not match was never reported.
        """
        n = len(per_request)
        for it in self._pending:
            if it.accepted is None and it.polls_waited >= 0:
                if it.meta.get("bs") == n:
                    it.accepted = [int(a) for a in per_request]
                    return
                it.polls_waited = -1        # skipped over: give up on this one

    def poll(self) -> list[dict[str, Any]]:
        """Records of the iterations whose events are complete, oldest first. Never blocks."""
        out: list[dict[str, Any]] = []
        while self._pending:
            it = self._pending[0]
            if it.end is None or not it.end.query():
                break
            if it.accepted is None and 0 <= it.polls_waited < self.accept_wait:
                it.polls_waited += 1
                break
            self._pending.popleft()
            out.append(self._record(it))
        return out

    def _record(self, it: _Iteration) -> dict[str, Any]:
        assert it.end is not None
        wall_ms = it.start.elapsed_time(it.end)
        marks: dict[str, float] = {}
        used = [it.start, it.end]
        for mark, s, e in it.spans:
            used.append(s)
            if e is not None:
                used.append(e)
                marks[mark] = marks.get(mark, 0.0) + s.elapsed_time(e)
        self.pool.give_back(used)
        meta = it.meta
        rec: dict[str, Any] = {
            R_SEQ: it.seq, R_T: it.t_end, R_EPOCH: meta["epoch"], R_RANK: self.rank,
            R_PLACEMENT: SHARDED,           # when meta does not say: the target's TP group
            # Unknown fields are left out, never null: readers use .get(key, default).
            **{key: meta[key] for key in KNOB_RECORD_KEYS.values() if meta.get(key) is not None},
            R_BS: meta.get("bs"), R_WALL_MS: round(wall_ms, 4),
            R_PHASE_MS: {k: round(v, 4) for k, v in compose_phases(marks, wall_ms).items()},
            R_SIMULATED: bool(meta.get("simulated", False)), R_EMULATED_COMM: False,
            R_ADAPTIVE: bool(meta.get("adaptive", False)),
        }
        if meta.get("pinned") is not None:
            rec[R_PINNED] = bool(meta["pinned"])
        ctx = meta.get("ctx")
        if ctx is not None and len(ctx) == meta.get("bs"):
            rec[R_CTX] = list(ctx)
        if it.accepted is not None:
            rec[R_ACCEPTED] = it.accepted
            rec[R_COMMITTED] = sum(it.accepted) + len(it.accepted)
        return rec
