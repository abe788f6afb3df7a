"""The result of analysing one capture: per rank, per iteration and across ranks, as plain data.

`TraceAnalysis.to_dict()` is the stored and displayed form (the recorder keeps it next to the trace,
the TUI and `specdecode-tune analyze --json` show it). Its shape, all times in milliseconds:

    {"schema": 1,
     "mode": "gpu" | "cpu" | "mixed",    # gpu: kernels attributed through launches; cpu: CPU ops
     "phases": ["draft", "verify", "verify_sample", "draft_extend", "other"],
     "ranks": [{"rank": 0, "file": "...-TP-0.trace.json.gz", "mode": "cpu",
                "thread": "1234",           # the engine/scheduler thread holding the phase spans
                "events": 91234, "kernels": 0, "phase_spans": 812,
                "unattributed_kernels": 0, "unattributed_ms": 0.0,
                "derived_verify": false,    # SGLang trace: verify/verify_sample derived from gaps
                "base_time_ns": 1764...,    # epoch ns of ts 0 (kineto), or null: epoch of an
                                            # iteration = base_time_ns / 1e9 + start_us / 1e6
                "total": ITER, "mean": ITER,          # sum and mean over the iterations
                "iterations": [ITER, ...]}],
     "across": null | {                     # present when there are two or more ranks
        "ranks": [0, 1], "aligned_iterations": 40,  # the n-th draft span of every rank
        "slowest_rank": 1,                  # most compute (busy - comm) over the aligned iterations
        "skew_ms": 3.2,                     # sum over iterations of max - min compute across ranks
        "wall_ms": {"max": ..., "min": ...},
        "phases": {"draft": {"max_ms", "min_ms", "skew_ms", "slowest_rank", "comm_max_ms"}, ...},
        "iterations": [{"index", "wall_max_ms", "wall_min_ms", "skew_ms", "slowest_rank"}, ...]},
     "warnings": ["..."]}

    ITER = {"index": 0, "start_us": 123.0,  # rank-local clock (total/mean: index -1)
            "wall_ms": 12.3,                # gpu: first kernel to next iteration's first kernel;
                                            # cpu: the iteration's window on the engine thread
            "busy_ms": 10.1,                # union of work (kernels | top-level CPU ops)
            "comm_ms": 2.0,                 # union of collective work
            "idle_ms": 2.2,                 # wall - busy
            "phases": {"draft": {"ms": 3.0,       # work attributed to the phase
                                 "comm_ms": 1.0,  # its collective part (never stack it on ms)
                                 "span_ms": 3.4,  # CPU wall inside the phase's spans
                                 "ar_ms": 0.8,    # the all-reduces among its collectives
                                 "ar_calls": 6,   # how many (kernels; cpu: our comm spans)
                                 "comm_calls": 8},  # every collective, counted the same way
                       ...}}

This module holds data and arithmetic only; it must not read traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes.trace_names import PHASES

SCHEMA = 1


def _r(x: float) -> float:
    return round(x, 4)


@dataclass
class PhaseTime:
    ms: float = 0.0
    """Work attributed to the phase: kernel time (gpu) or top-level CPU op time (cpu)."""
    comm_ms: float = 0.0
    """The part of `ms` spent in collectives."""
    span_ms: float = 0.0
    """CPU wall time inside the phase's spans (for derived SGLang phases, the gap they fill)."""
    ar_ms: float = 0.0
    """The all-reduces among the collectives (what an all-reduce backend could take over)."""
    ar_calls: float = 0.0
    """How many all-reduces ran: kernels (gpu) or our communicator's spans (cpu)."""
    comm_calls: float = 0.0
    """How many collectives of any kind ran, counted the same way."""

    def add(self, other: PhaseTime) -> None:
        self.ms += other.ms
        self.comm_ms += other.comm_ms
        self.span_ms += other.span_ms
        self.ar_ms += other.ar_ms
        self.ar_calls += other.ar_calls
        self.comm_calls += other.comm_calls

    def to_dict(self, scale: float = 1.0) -> dict[str, float]:
        return {"ms": _r(self.ms * scale), "comm_ms": _r(self.comm_ms * scale),
                "span_ms": _r(self.span_ms * scale), "ar_ms": _r(self.ar_ms * scale),
                "ar_calls": _r(self.ar_calls * scale), "comm_calls": _r(self.comm_calls * scale)}


def _phase_dict() -> dict[str, PhaseTime]:
    return {p: PhaseTime() for p in PHASES}


@dataclass
class IterationTimes:
    index: int
    start_us: float = 0.0
    decode_start_us: float = 0.0
    """Where its decode phases start: after the prefills it takes in (start_us is the first of
    them). An overlapped engine launches the iteration's record there (`t_launch`)."""
    wall_ms: float = 0.0
    busy_ms: float = 0.0
    comm_ms: float = 0.0
    phases: dict[str, PhaseTime] = field(default_factory=_phase_dict)

    @property
    def idle_ms(self) -> float:
        return max(0.0, self.wall_ms - self.busy_ms)

    @property
    def compute_ms(self) -> float:
        """Work that is not communication: what a rank's peers wait for in their collectives."""
        return self.busy_ms - self.comm_ms

    def add(self, other: IterationTimes) -> None:
        self.wall_ms += other.wall_ms
        self.busy_ms += other.busy_ms
        self.comm_ms += other.comm_ms
        for p, t in other.phases.items():
            self.phases[p].add(t)

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        return {
            "index": self.index, "start_us": _r(self.start_us), "decode_start_us": _r(self.decode_start_us),
            "wall_ms": _r(self.wall_ms * scale), "busy_ms": _r(self.busy_ms * scale),
            "comm_ms": _r(self.comm_ms * scale), "idle_ms": _r(self.idle_ms * scale),
            "phases": {p: t.to_dict(scale) for p, t in self.phases.items()},
        }


def sum_iterations(iterations: list[IterationTimes]) -> IterationTimes:
    total = IterationTimes(index=-1)
    for it in iterations:
        total.add(it)
    return total


@dataclass
class RankAnalysis:
    rank: int
    file: str
    mode: str
    thread: str
    events: int
    kernels: int
    phase_spans: int
    unattributed_kernels: int = 0
    unattributed_ms: float = 0.0
    derived_verify: bool = False
    base_time_ns: int | None = None
    """Kineto's `baseTimeNanoseconds`: epoch ns of ts 0, so start_us maps to wall-clock time."""
    iterations: list[IterationTimes] = field(default_factory=list)
    world_size: int | None = None
    """`distributedInfo.world_size` of the file, when it says."""
    bad_times: int = 0
    """Events skipped because their ts/dur was NaN, infinite or negative."""

    @property
    def total(self) -> IterationTimes:
        return sum_iterations(self.iterations)

    def to_dict(self) -> dict[str, Any]:
        total = self.total
        n = len(self.iterations)
        return {
            "rank": self.rank, "file": self.file, "mode": self.mode, "thread": self.thread,
            "events": self.events, "kernels": self.kernels, "phase_spans": self.phase_spans,
            "unattributed_kernels": self.unattributed_kernels,
            "unattributed_ms": _r(self.unattributed_ms), "derived_verify": self.derived_verify,
            "base_time_ns": self.base_time_ns,
            "total": total.to_dict(),
            "mean": total.to_dict(1.0 / n if n else 0.0),
            "iterations": [it.to_dict() for it in self.iterations],
        }


@dataclass
class CrossRank:
    """Ranks compared iteration by iteration (aligned by the n-th draft span, not by clocks)."""

    ranks: list[int]
    aligned_iterations: int
    slowest_rank: int
    skew_ms: float
    wall_max_ms: float
    wall_min_ms: float
    phases: dict[str, dict[str, float]]
    iterations: list[dict[str, float]]

    @classmethod
    def compare(cls, ranks: list[RankAnalysis]) -> CrossRank:
        n = min(len(r.iterations) for r in ranks)
        ids = [r.rank for r in ranks]
        per_iter: list[dict[str, float]] = []
        skew_total = 0.0
        for k in range(n):
            its = [r.iterations[k] for r in ranks]
            compute = [it.compute_ms for it in its]
            walls = [it.wall_ms for it in its]
            skew = max(compute) - min(compute)
            skew_total += skew
            per_iter.append({"index": k, "wall_max_ms": _r(max(walls)), "wall_min_ms": _r(min(walls)),
                             "skew_ms": _r(skew), "slowest_rank": ids[compute.index(max(compute))]})
        totals = [sum_iterations(r.iterations[:n]) for r in ranks]
        compute_tot = [t.compute_ms for t in totals]
        phases: dict[str, dict[str, float]] = {}
        for p in PHASES:
            ms = [t.phases[p].ms for t in totals]
            comp = [t.phases[p].ms - t.phases[p].comm_ms for t in totals]
            phases[p] = {"max_ms": _r(max(ms)), "min_ms": _r(min(ms)), "skew_ms": _r(max(comp) - min(comp)),
                         "slowest_rank": ids[comp.index(max(comp))],
                         "comm_max_ms": _r(max(t.phases[p].comm_ms for t in totals))}
        walls = [t.wall_ms for t in totals]
        return cls(ranks=ids, aligned_iterations=n,
                   slowest_rank=ids[compute_tot.index(max(compute_tot))] if n else ids[0],
                   skew_ms=skew_total, wall_max_ms=max(walls), wall_min_ms=min(walls),
                   phases=phases, iterations=per_iter)

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "aligned_iterations": self.aligned_iterations,
                "slowest_rank": self.slowest_rank, "skew_ms": _r(self.skew_ms),
                "wall_ms": {"max": _r(self.wall_max_ms), "min": _r(self.wall_min_ms)},
                "phases": self.phases, "iterations": self.iterations}


@dataclass
class TraceAnalysis:
    ranks: list[RankAnalysis]
    warnings: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        modes = {r.mode for r in self.ranks}
        return modes.pop() if len(modes) == 1 else "mixed"

    @property
    def across(self) -> CrossRank | None:
        return CrossRank.compare(self.ranks) if len(self.ranks) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        across = self.across
        return {"schema": SCHEMA, "mode": self.mode, "phases": list(PHASES),
                "ranks": [r.to_dict() for r in self.ranks],
                "across": across.to_dict() if across else None,
                "warnings": list(self.warnings)}
