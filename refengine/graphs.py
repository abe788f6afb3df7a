"""Graph capture for the decode phases: a cache of captured forwards keyed by
(phase, placement, rows, shape), with static input buffers, batch and context padding, capture
bookkeeping, eviction, fallbacks to eager, and statistics.

Three modes (EngineOptions.cuda_graph):
  * ``cuda``   torch.cuda.CUDAGraph: the first call of a key warms up, captures, then replays;
               every later call copies its inputs into the key's static buffers and replays.
  * ``static`` the same static buffers, padding, keys, capture events and records, but the
               captured body is executed again instead of replayed. It exists so that everything
               except the CUDA call itself runs (and is tested) on CPU ranks.
  * ``off``    plain eager calls (no padding, no keys): the CPU default.

Keys. ``rows`` is the batch padded up to a bucket (1, 2, 4, 8, ...; pad rows point at a spare
KV-pool row); ``shape`` is (tokens per row, context width bucket, input width). Steps are not in
any key: a draft step's graph is one draft forward, replayed steps - 1 times, so changing steps
costs nothing; a new (topk, num_draft_tokens) shape is captured the first time it is needed.

Greedy chains (`graphed_chain`) keep their whole state in the key's buffers: each replay reads the
previous step's token, hidden state and position from them and writes the next ones back, so a
step costs one replay and no host-side op (on a slow host those ops, not the GPU, set the pace of
a small draft head). Such "in place" keys use the caller's state tensors as their static buffers.

Collectives inside a captured graph cannot be timed one by one: the communicator counts them at
capture (``Communicator.capturing``), each replay adds those counts as in-graph calls, and their
time must come from traces (phase records then carry no comm_ms for that phase, only
``comm_calls_in_graph``). Per-phase CUDA events around the replays are the PhaseTimer's.

Captures whose body runs collectives ("group" scope: the sharded draft, the target) happen in
lockstep on every rank, so their LRU eviction is a separate list fed in the same order on every
rank; ranks agree on each capture's success before using it. Draft graphs of the replicated and
rank0 placements are rank-local ("local" scope).

Must not decide what runs in a phase (refengine.engine does) nor touch requests.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

MODES = ("auto", "off", "static", "cuda")
_BODY = threading.local()


UNCOMPILED_PHASES = frozenset({"prefill"})
"""Captured but never torch.compile'd: each prompt-length bucket would compile a new static graph
at the first prompt of that length, long after warm-up; the replay alone removes the launches."""


def in_graph_body() -> bool:
    """True while a key's body runs for a capture, its warm-up or a static re-run: the forwards
    with a bounded set of decode shapes, the only ones torch.compile'd code runs in
    (refengine.compiled); eager calls (graphs off, failed captures, long prompts) and the bodies of
    UNCOMPILED_PHASES are outside."""
    return getattr(_BODY, "on", False)


@contextmanager
def _in_body(key: "GraphKey | None" = None):
    prev = in_graph_body()
    _BODY.on = key is None or key.phase not in UNCOMPILED_PHASES
    try:
        yield
    finally:
        _BODY.on = prev
GROUP, LOCAL = "group", "local"


class GraphKey(NamedTuple):
    phase: str          # draft_step | draft_extend | verify | prefill
    placement: str      # the draft placement; "-" for the target (same graph under every placement)
    rows: int           # padded batch
    shape: tuple        # (tokens per row, context bucket, input width)

    def label(self) -> str:
        return f"{self.phase}/{self.placement}/rows={self.rows}/shape={'x'.join(map(str, self.shape))}"


@dataclass
class CaptureEvent:
    """One capture (or failed capture): goes into the phase record of the iteration it happened
    in, which the A/B readout must exclude (the record's ``capture`` flag is true)."""

    key: GraphKey
    ms: float
    ok: bool
    comm_calls: int = 0
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.key.phase, "placement": self.key.placement, "rows": self.key.rows,
                "shape": list(self.key.shape), "ms": round(self.ms, 3), "ok": self.ok,
                "comm_calls": self.comm_calls, "reason": self.reason}


@dataclass
class _Entry:
    key: GraphKey
    scope: str
    inputs: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, ...] = ()
    graph: Any = None                      # torch.cuda.CUDAGraph in cuda mode
    body: Callable | None = None           # static mode re-runs it
    comm_ops: list[tuple[str, int]] = field(default_factory=list)   # (op, bytes) captured inside
    eager_reason: str | None = None        # capture failed: this key runs eagerly
    replays: int = 0
    replay_ms: float = 0.0
    timed: int = 0
    pending: list = field(default_factory=list)   # (start, end) CUDA events not yet read

    def fold(self) -> None:
        """Add the pending CUDA-event times of the replays that have run. Never waits: with the
        overlap scheduler a replay may still be queued behind the iteration in flight."""
        done = 0
        for a, b in self.pending:
            if not b.query():
                break
            self.replay_ms += a.elapsed_time(b)
            done += 1
        self.timed += done
        del self.pending[:done]


@dataclass
class GraphStats:
    captures: int = 0
    capture_ms: float = 0.0
    replays: int = 0
    eager_calls: int = 0
    evictions: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"captures": self.captures, "capture_ms": round(self.capture_ms, 3), "replays": self.replays,
                "eager_calls": self.eager_calls, "evictions": self.evictions, "failures": dict(self.failures)}


def resolve_mode(mode: str, device: str, emulated_comm: bool) -> tuple[str, str | None]:
    """-> (mode in effect, why it differs from the one asked for, or None)."""
    if mode not in MODES:
        raise ValueError(f"cuda_graph must be one of {', '.join(MODES)}, got {mode!r}")
    cuda = str(device).startswith("cuda")
    if mode == "auto":
        mode = "cuda" if cuda else "off"
    if mode == "cuda" and not cuda:
        return "off", "CUDA graphs need a CUDA device: running eagerly"
    if mode == "cuda" and not torch.cuda.is_available():
        return "off", "CUDA is not available: running eagerly"
    if mode != "off" and emulated_comm:
        # The emulated latency is a host sleep inside each collective: a replay would skip it.
        return "off", "emulated comm latency needs eager collectives: running eagerly"
    return mode, None


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to max_rows (max_rows itself always included)."""
    out, b = [], 1
    while b < max_rows:
        out.append(b)
        b *= 2
    out.append(max_rows)
    return tuple(out)


def ctx_bucket(ctx: int, row_len: int, floor: int = 256) -> int:
    """Context width for a graph: the next power of two >= ctx (at least `floor`), capped at
    row_len. Coarse on purpose: few captures. The masked extra columns cost little: the attention
    kernel stops at each request's visible limit (attend.visible_limit), so rows of 320 in a bucket
    of 472 read their own K/V, not 1.5× it (benchmarks/results/fused_kernels_h200.md, section 4);
    what is left is the mask itself, [B, T, bucket] booleans."""
    b = floor
    while b < ctx:
        b *= 2
    return min(b, row_len)


class GraphCache:
    """Captured forwards by key, with LRU eviction per scope.

    Args:
        mode: ``off``, ``static`` or ``cuda`` (already resolved, see resolve_mode).
        comm: the Communicator (counting at capture, in-graph calls at replay, agreement).
        max_rows: the largest batch; rows are padded to row_buckets(max_rows).
        row_len: KV-pool row length (caps the context buckets).
        max_graphs: per scope; the least recently used key beyond it is dropped.
        warmup: eager runs before a CUDA capture (on a side stream, as torch recommends).
        time_replays: CUDA events around every replay, kept per key (for benchmarks).
        off_reason: why the mode is off when another was asked for (shown in stats).
    """

    def __init__(self, mode: str, comm, max_rows: int, row_len: int, max_graphs: int = 64,
                 warmup: int = 2, time_replays: bool = False, off_reason: str | None = None):
        if mode not in ("off", "static", "cuda"):
            raise ValueError(f"unresolved graph mode {mode!r}")
        self.mode, self.comm = mode, comm
        self.buckets = row_buckets(max_rows)
        self.row_len, self.max_graphs, self.warmup = row_len, max_graphs, warmup
        self.time_replays = time_replays
        self.off_reason = off_reason
        self.stats = GraphStats()
        self._lru: dict[str, OrderedDict[GraphKey, _Entry]] = {GROUP: OrderedDict(), LOCAL: OrderedDict()}
        self._events: list[CaptureEvent] = []
        self._state: dict[GraphKey, dict[str, torch.Tensor]] = {}

    def state(self, key: GraphKey, make: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The persistent state buffers of an in-place key (made on first use, kept across
        evictions so a recapture reads the same memory)."""
        if key not in self._state:
            self._state[key] = make()
        return self._state[key]

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def rows_for(self, b: int) -> int:
        for r in self.buckets:
            if r >= b:
                return r
        raise ValueError(f"batch {b} exceeds the largest graph batch {self.buckets[-1]}")

    def ctx_for(self, ctx: int) -> int:
        return ctx_bucket(ctx, self.row_len)

    def __contains__(self, key: GraphKey) -> bool:
        return any(key in lru for lru in self._lru.values())

    def keys(self) -> list[GraphKey]:
        return [k for lru in self._lru.values() for k in lru]

    def drain_events(self) -> list[CaptureEvent]:
        ev, self._events = self._events, []
        return ev

    def invalidate(self, pred: Callable[[GraphKey], bool]) -> int:
        """Drop every key for which pred(key) is true (e.g. when weights a graph read are freed)."""
        n = 0
        for lru in self._lru.values():
            for k in [k for k in lru if pred(k)]:
                del lru[k]
                n += 1
        self.stats.evictions += n
        return n

    # -- running ---------------------------------------------------------------------------------
    def run(self, key: GraphKey, scope: str, inputs: dict[str, torch.Tensor],
            body: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]],
            in_place: bool = False) -> tuple[torch.Tensor, ...]:
        """body(inputs) -> outputs, through the key's graph. `inputs` must already be padded to
        the key's shapes; the outputs are the key's static buffers, valid until its next replay.
        in_place: `inputs` are the key's own persistent buffers (see `state`), which the body
        reads and updates: nothing is copied in, and a capture's warm-up runs leave them as
        they were."""
        if self.mode == "off":
            self.stats.eager_calls += 1
            return body(inputs)
        lru = self._lru[scope]
        entry = lru.get(key)
        if entry is None:
            entry = self._capture(key, scope, inputs, body, in_place)
            lru[key] = entry
            self._evict(lru)
            return entry.outputs
        lru.move_to_end(key)
        if entry.eager_reason is not None:
            self.stats.eager_calls += 1
            return body(inputs)
        if not in_place:
            for name, t in inputs.items():
                entry.inputs[name].copy_(t)
        self._replay(entry)
        return entry.outputs

    def _evict(self, lru: OrderedDict) -> None:
        while len(lru) > self.max_graphs:
            lru.popitem(last=False)
            self.stats.evictions += 1

    def _replay(self, entry: _Entry) -> None:
        start = end = None
        if self.time_replays and self.mode == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        if self.mode == "cuda":
            entry.graph.replay()
        else:
            with self.comm.capturing() as ops, _in_body(entry.key):
                outs = entry.body(entry.inputs)
            if ops != entry.comm_ops:
                # The static stand-in checks what a CUDA replay cannot: same collectives as captured.
                raise RuntimeError(f"graph {entry.key.label()}: replay ran collectives {ops}, "
                                   f"captured {entry.comm_ops}")
            for dst, src in zip(entry.outputs, outs):
                dst.copy_(src)
        if start is not None:
            end.record()
            entry.pending.append((start, end))
            if len(entry.pending) >= 256:
                entry.fold()
        elif self.time_replays:
            entry.timed += 1
            entry.replay_ms += (time.perf_counter() - t0) * 1e3
        self.comm.add_graph_calls(entry.comm_ops)
        entry.replays += 1
        self.stats.replays += 1

    def _capture(self, key: GraphKey, scope: str, inputs: dict[str, torch.Tensor], body, in_place: bool) -> _Entry:
        t0 = time.perf_counter()
        static = inputs if in_place else {name: t.clone() for name, t in inputs.items()}
        # An in-place body changes its buffers: warm-ups and a failed capture must not leave
        # them changed (the call's one real run is the replay, or the eager run on failure).
        snap = {name: t.clone() for name, t in inputs.items()} if in_place and self.mode == "cuda" else None
        entry = _Entry(key, scope, static, body=body)
        err: str | None = None
        try:
            if self.mode == "cuda":
                self._capture_cuda(entry, body, snap)
            else:
                with self.comm.capturing() as ops, _in_body(key):
                    outs = body(static)
                entry.outputs = tuple(o.clone() for o in outs)
                entry.comm_ops = list(ops)
        except Exception as e:  # capture unavailable for this body: run it eagerly from now on
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
        if scope == GROUP:
            # Every rank must take the same path, or collectives stop matching.
            agreed = self.comm.agree(err is None)
            if err is None and not agreed:
                err = "another rank failed to capture this key"
        ms = (time.perf_counter() - t0) * 1e3
        self.stats.capture_ms += ms
        self._events.append(CaptureEvent(key, ms, err is None, len(entry.comm_ops), err))
        if snap is not None:
            _restore(static, snap)
        if err is not None:
            entry.graph, entry.eager_reason, entry.comm_ops = None, err, []
            self.stats.failures[err] = self.stats.failures.get(err, 0) + 1
            self.stats.eager_calls += 1
            entry.outputs = tuple(body(inputs))
        else:
            self.stats.captures += 1
            if self.mode == "cuda":
                entry.graph.replay()        # the capture did not execute: this call's results
            self.comm.add_graph_calls(entry.comm_ops)
        return entry

    def _capture_cuda(self, entry: _Entry, body, snap: dict[str, torch.Tensor] | None) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), _in_body(entry.key):
            # Warm-up: real (eager) runs. Writes go to the same KV slots the replay writes, with
            # the same values, so they are harmless; NCCL and cuBLAS initialise here.
            for _ in range(self.warmup):
                body(entry.inputs)
                if snap is not None:
                    _restore(entry.inputs, snap)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with self.comm.capturing() as ops:
            # A private memory pool per graph: replays happen in any order (draft steps, verify,
            # extend, other keys), so no graph may reuse memory another graph's outputs live in.
            with torch.cuda.graph(graph), _in_body(entry.key):
                outs = body(entry.inputs)
        entry.graph, entry.outputs, entry.comm_ops = graph, tuple(outs), list(ops)

    # -- statistics ------------------------------------------------------------------------------
    def stats_dict(self) -> dict[str, Any]:
        """Picklable summary: totals, the mode, and per key replays, mean replay ms and the
        collectives inside (what a benchmark prints next to the proxy)."""
        keys = []
        for scope, lru in self._lru.items():
            for k, e in lru.items():
                e.fold()
                ms = e.replay_ms if e.timed else None
                keys.append({"key": k.label(), "phase": k.phase, "placement": k.placement, "rows": k.rows,
                             "shape": list(k.shape), "scope": scope, "replays": e.replays,
                             "replay_ms_mean": (ms / e.timed) if ms is not None else None,
                             "comm_calls": len(e.comm_ops), "eager": e.eager_reason})
        return {"mode": self.mode, "off_reason": self.off_reason, **self.stats.as_dict(), "keys": keys}


def _restore(bufs: dict[str, torch.Tensor], snap: dict[str, torch.Tensor]) -> None:
    for name, t in snap.items():
        bufs[name].copy_(t)


CHAIN_MAX_STEPS = 64


def chain_tail(logits: torch.Tensor, h: torch.Tensor, d2t: torch.Tensor, out: torch.Tensor,
               step: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
    """The greedy chain's work after one draft forward, in place on the chain's graph state:
    the argmax, the draft-to-target id map, the token stored at `step`, and the next step's
    inputs (ids, hidden, positions and the causal mask they see). One function so that compiled
    (refengine.compiled.compile_chain_tail) it is a few fused kernels, not a dozen launches a step."""
    tok = logits[:, -1].argmax(-1)
    tok = tok + d2t[tok]
    out.scatter_(1, step.view(1, 1).expand(tok.shape[0], 1), tok[:, None])
    ids.copy_(tok[:, None])
    hidden.copy_(h)
    positions.add_(1)
    step.add_(1)
    mask.copy_(torch.arange(mask.shape[-1], device=mask.device)[None, None, :] <= positions[:, :, None])
    return tok


def graphed_chain(cache: GraphCache, placement: str, scope: str, head, kv, rows: torch.Tensor,
                  seq_lens: torch.Tensor, first: torch.Tensor, hidden: torch.Tensor, steps: int, ctx: int,
                  pad_row: int, tail: Callable[..., torch.Tensor] = chain_tail) -> torch.Tensor:
    """refengine.spec.draft_chain (greedy, [B, steps] target ids) with the chain's state in the
    graph: one key per (placement, rows, ctx), replayed steps - 1 times with no host op between.

    Args mirror draft_chain; `head` is the placed head itself (not a graphed stand-in); `tail` is
    chain_tail or its compiled form."""
    b, dev = rows.shape[0], rows.device
    r, width = cache.rows_for(b), hidden.shape[-1]
    key = GraphKey("draft_step", placement, r, (1, ctx, width, "chain"))
    st = cache.state(key, lambda: {
        "ids": torch.zeros(r, 1, dtype=torch.long, device=dev),
        "hidden": torch.zeros(r, 1, width, dtype=hidden.dtype, device=dev),
        "rows": torch.full((r,), pad_row, dtype=rows.dtype, device=dev),
        "positions": torch.zeros(r, 1, dtype=torch.long, device=dev),
        "mask": torch.zeros(r, 1, ctx, dtype=torch.bool, device=dev),
        "out": torch.zeros(r, CHAIN_MAX_STEPS, dtype=torch.long, device=dev),
        "step": torch.zeros(1, dtype=torch.long, device=dev)})
    st["ids"][:b, 0] = first
    st["hidden"][:b, 0] = hidden
    st["rows"][:b] = rows
    st["positions"][:b, 0] = seq_lens
    if b < r:   # pad rows: the spare KV row, from slot 0 (a smaller batch may have used them)
        st["rows"][b:] = pad_row
        st["positions"][b:] = 0
    torch.le(torch.arange(ctx, device=dev)[None, None, :], st["positions"][:, :, None], out=st["mask"])
    st["step"].zero_()
    d2t = head.d2t

    def body(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        from refengine.models.layers import AttnMeta

        pos = x["positions"]
        logits, h = head(x["ids"], x["hidden"], AttnMeta(x["rows"], pos, pos, x["mask"]), kv)
        return (tail(logits, h, d2t, x["out"], x["step"], x["ids"], x["hidden"], pos, x["mask"]),)

    for _ in range(steps - 1):
        cache.run(key, scope, st, body, in_place=True)
    return torch.cat([first[:, None], st["out"][:b, :steps - 1]], 1)


def graphed_forward(cache: GraphCache, phase: str, placement: str, scope: str, ids: torch.Tensor,
                    hidden: torch.Tensor | None, meta, pad_row: int,
                    fn: Callable[..., tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """fn(ids [B, T], hidden [B, T, W] | None, meta: AttnMeta) -> outputs with batch first, run
    through the cache: the batch padded to its bucket (pad rows use KV-pool row `pad_row`,
    attend to its slot 0 only and write its slots 0..T-1), the mask's context padded to its
    bucket with invisible columns. Returns the outputs of the real rows."""
    if not cache.enabled:
        return fn(ids, hidden, meta)
    b, t = ids.shape
    rows, ctx = cache.rows_for(b), cache.ctx_for(meta.ctx)
    width = hidden.shape[-1] if hidden is not None else 0
    key = GraphKey(phase, placement, rows, (t, ctx, width))
    pad, dev = rows - b, ids.device
    if pad == 0 and ctx == meta.ctx:
        # Already the key's shapes (the engine buckets its context like the cache): no padding
        # kernels, only the copies into the static buffers.
        inputs = {"ids": ids, "rows": meta.rows, "positions": meta.positions, "slots": meta.slots, "mask": meta.mask}
        if hidden is not None:
            inputs["hidden"] = hidden
        return cache.run(key, scope, inputs, _body(fn))
    mask = torch.zeros(rows, t, ctx, dtype=torch.bool, device=dev)
    mask[:b, :, : meta.ctx] = meta.mask
    mask[b:, :, 0] = True
    inputs = {
        "ids": torch.cat([ids, ids.new_zeros(pad, t)]),
        "rows": torch.cat([meta.rows, meta.rows.new_full((pad,), pad_row)]),
        "positions": torch.cat([meta.positions, meta.positions.new_zeros(pad, t)]),
        "slots": torch.cat([meta.slots, torch.arange(t, device=dev).expand(pad, t).to(meta.slots.dtype)]),
        "mask": mask,
    }
    if hidden is not None:
        inputs["hidden"] = torch.cat([hidden, hidden.new_zeros(pad, *hidden.shape[1:])])

    return tuple(o[:b] for o in cache.run(key, scope, inputs, _body(fn)))


def _body(fn: Callable[..., tuple[torch.Tensor, ...]]) -> Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]]:
    from refengine.models.layers import AttnMeta

    def body(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(fn(x["ids"], x.get("hidden"), AttnMeta(x["rows"], x["positions"], x["slots"], x["mask"])))
    return body
