"""The one communicator every collective goes through: it counts calls and bytes, times them,
labels them with the phase they ran in, and opens a `specdecode.comm.<op>` profiler span.

It can also add an emulated latency per collective (`A_us[,B_us_per_KB]`), so placement
trade-offs show on CPU; such time is labelled as emulation wherever it is reported.
Layers never call torch.distributed themselves. Must not decide anything about placement.
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.profiler import record_function

from probes.names import ALL_PHASES as PHASES  # the phases a collective is labelled with
from probes.names import OTHER


class Clock:
    """Monotonic host clock (CPU path). `mark()` returns a handle, `ms(a, b)` the time between."""

    def mark(self):
        return time.perf_counter()

    def ms(self, a, b) -> float:
        return (b - a) * 1e3

    def sync(self) -> None:
        pass

    def wait(self, mark) -> None:
        """Until `mark` and everything before it on the stream has run (CPU: already has)."""


class CudaClock(Clock):
    """CUDA events on the current stream (GPU path): read only after `sync()`."""

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def ms(self, a, b) -> float:
        return a.elapsed_time(b)

    def sync(self) -> None:
        torch.cuda.synchronize()

    def wait(self, mark) -> None:
        # The event alone, not the device: work launched after it keeps running.
        mark.synchronize()


@dataclass
class CommTotals:
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_op: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    graph_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Communicator:
    """Collectives over one process group (the TP group), plus a CPU (gloo) group for control.

    Args:
        group: the group tensors go over (NCCL on GPU, gloo on CPU); None = the default group.
        cpu_group: a gloo group for pickled control messages (the same as `group` on CPU).
        latency_us: (A, B): emulate A µs + B µs per KB after every collective.
    """

    def __init__(self, rank: int, world: int, group=None, cpu_group=None, clock: Clock | None = None,
                 latency_us: tuple[float, float] | None = None):
        self.rank, self.world = rank, world
        self.group, self.cpu_group = group, cpu_group if cpu_group is not None else group
        self.clock = clock or Clock()
        self.latency_us = latency_us
        self.phase = OTHER
        self._pending: list[tuple[str, str, int, object, object]] = []
        self._graph: list[tuple[str, str, int]] = []
        self._capture: list[tuple[str, int]] | None = None
        self.totals = CommTotals()

    @property
    def emulated(self) -> bool:
        return self.latency_us is not None

    # -- the collectives -------------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        with self._op("all_reduce", t):
            dist.all_reduce(t, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        with self._op("all_gather", t, factor=self.world):
            dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        with self._op("broadcast", t):
            dist.broadcast(t, src=src, group=self.group)
        return t

    def broadcast_object(self, obj, src: int = 0):
        """Pickle `obj` on `src` and deliver it to every rank over the CPU group (control plane):
        a fixed 8-byte length first, then the payload. None travels as length 0 alone (one
        broadcast instead of two: the per-iteration command is usually empty)."""
        payload = pickle.dumps(obj) if self.rank == src and obj is not None else b""
        size = torch.tensor([len(payload)], dtype=torch.long)
        with self._op("broadcast_object", size):
            dist.broadcast(size, src=src, group=self.cpu_group)
            n = int(size.item())
            if n == 0:
                return None if self.rank != src else obj
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if self.rank == src \
                else torch.empty(n, dtype=torch.uint8)
            dist.broadcast(buf, src=src, group=self.cpu_group)
        return obj if self.rank == src else pickle.loads(buf.numpy().tobytes())

    def agree(self, ok: bool) -> bool:
        """True only if every rank passes True (a MIN over the CPU group); used so that all
        ranks take the same path after a graph capture."""
        if self.world == 1:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        with self._op("agree", flag):
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return bool(flag.item())

    # -- graphs ----------------------------------------------------------------------------------
    @contextmanager
    def capturing(self):
        """Inside a graph capture (or its CPU stand-in): collectives are listed as (op, bytes),
        not timed (events cannot be timed one by one inside a graph) and never delayed."""
        prev, self._capture = self._capture, []
        try:
            yield self._capture
        finally:
            self._capture = prev

    def add_graph_calls(self, ops: list[tuple[str, int]]) -> None:
        """One replay of a graph holding these collectives, in the current phase: counted, with
        no time (it comes from traces)."""
        for op, nbytes in ops:
            self._graph.append((self.phase, op, nbytes))

    def take(self) -> tuple[list, list]:
        """The collectives recorded since the last take, handed over for a later drain (an
        iteration launched ahead is read after the next one has started recording)."""
        pending, graph = self._pending, self._graph
        self._pending, self._graph = [], []
        return pending, graph

    def drain_graph(self, graph: list | None = None) -> tuple[dict[str, int], dict[str, int]]:
        """Per-phase (calls, bytes) of collectives replayed inside graphs since the last drain
        (or in `graph`, from take())."""
        calls: dict[str, int] = defaultdict(int)
        nbytes: dict[str, int] = defaultdict(int)
        for phase, op, size in (self._graph if graph is None else graph):
            calls[phase] += 1
            nbytes[phase] += size
            self.totals.calls[phase] += 1
            self.totals.bytes[phase] += size
            self.totals.by_op[op] += 1
            self.totals.graph_calls[phase] += 1
        if graph is None:
            self._graph.clear()
        return dict(calls), dict(nbytes)

    def barrier(self) -> None:
        with self._op("barrier", torch.empty(0)):
            dist.barrier(group=self.cpu_group)

    # -- accounting ------------------------------------------------------------------------------
    def _op(self, op: str, t: torch.Tensor, factor: int = 1):
        return _Span(self, op, t.numel() * t.element_size() * factor)

    def drain(self, pending: list | None = None) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
        """Per-phase (ms, calls, bytes) since the last drain (or in `pending`, from take()); call
        once the clock's marks are complete (sync() or wait())."""
        ms: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        nbytes: dict[str, int] = defaultdict(int)
        for phase, op, size, a, b in (self._pending if pending is None else pending):
            t = self.clock.ms(a, b)
            ms[phase] += t
            calls[phase] += 1
            nbytes[phase] += size
            self.totals.ms[phase] += t
            self.totals.calls[phase] += 1
            self.totals.bytes[phase] += size
            self.totals.by_op[op] += 1
        if pending is None:
            self._pending.clear()
        return dict(ms), dict(calls), dict(nbytes)


SPIN_S = 0.0001
"""The last stretch of an emulated latency is spun, not slept: time.sleep overshoots by the
process's timer slack (50 µs by default) and more on a busy host, which would make a 200 µs link
cost more than it says. Only the last 100 µs spin: a rank spinning for the whole latency takes a
core (or its hyperthread sibling) from the other rank's compute, which slowed it measurably."""

_slack_set = False


def _tight_timer_slack() -> None:
    """Ask Linux for a 1 µs timer slack in this process, once (emulation only; elsewhere a no-op)."""
    global _slack_set
    if _slack_set:
        return
    _slack_set = True
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)     # PR_SET_TIMERSLACK, ns
    except Exception:
        pass


def emulate_wait(seconds: float) -> None:
    """Wait `seconds` on the host clock: sleep the coarse part, spin the last SPIN_S."""
    end = time.perf_counter() + seconds
    _tight_timer_slack()
    if seconds > SPIN_S:
        time.sleep(seconds - SPIN_S)
    while time.perf_counter() < end:
        pass


class _Span:
    """Times one collective, emulates latency inside it, and names it in the profiler."""

    def __init__(self, comm: Communicator, op: str, nbytes: int):
        self.comm, self.op, self.nbytes = comm, op, nbytes

    def __enter__(self):
        self.rf = record_function(f"specdecode.comm.{self.op}")
        self.rf.__enter__()
        self.captured = self.comm._capture
        self.start = None if self.captured is not None else self.comm.clock.mark()
        return self

    def __exit__(self, *exc):
        if self.captured is not None:
            self.rf.__exit__(*exc)
            if exc[0] is None:
                self.captured.append((self.op, self.nbytes))
            return False
        lat = self.comm.latency_us
        if lat is not None and exc[0] is None:
            # Emulated link latency (labelled as emulation by whoever reports comm time).
            emulate_wait((lat[0] + lat[1] * self.nbytes / 1024.0) / 1e6)
        end = self.comm.clock.mark()
        self.rf.__exit__(*exc)
        if exc[0] is None:
            self.comm._pending.append((self.comm.phase, self.op, self.nbytes, self.start, end))
        return False
