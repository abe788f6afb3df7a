"""One rank's engine: the models on this rank, the running requests, and one decode iteration.

Every rank runs the same Engine methods in the same order (rank 0's broadcast commands decide
which), so all ranks hold the same requests, lengths and tokens; only rank 0 reports them.
Phases are timed here: `draft`, `verify`, `verify_sample`, `draft_extend`, `other`, and `prefill`
(the requests admitted since the previous iteration, counted in the next record), each with the
communicator's time inside it, under SGLang's profiler span names where SGLang has one.
With an adaptive schedule (SGLang's --speculative-adaptive) the steps of each iteration are chosen
at its launch from its batch size by the shared policy, which is fed the accepted drafts as they are
read; a tier switch is not a config change (same epoch), and each record says the steps it ran.
Steps 0 is SGLang 0.5.23's tier 0 (a one-token verify plus a draft-extend, so the draft stays warm);
an engine without a draft (`--speculative-algorithm NONE`) is plain decoding. What drafts and what
verifies is chosen once per configuration (refengine.roles: chain or tree, greedy or simulated).

Semantics worth knowing:
- Sampling (temperature > 0) is SGLang's target-only tree sampling for any topk; with
  `speculative_use_rejection_sampling` and topk = 1 the chain is drawn from q = softmax(draft / T)
  and accepted with min(1, p / q). Coins come from a per-request generator seeded by the request's
  seed (else crc32(rid) ^ random_seed), drawn identically on every rank.
- The acceptance simulator (`speculative_simulate_accept`, or a speculation profile) runs all the
  draft and verify compute, then forces how many drafts count as accepted; output tokens are then
  the drafts and records say `simulated: true`.
- A topk switch costs nothing at switch time: the last extend's full draft logits are kept per
  request (buffers sized for topk <= 8 and N <= 64). A placement switch moves the draft KV between
  iterations, counted in `other` of the next record.
- With the overlap scheduler a request finished by a stop token has one more iteration on the
  device; its results are dropped.
- A failure in one request's verify_sample work (its sampling inputs, its verify decision) fails
  that request alone: the batch is decided again row by row, a row that fails alone gets an error
  update and its slot back, the others keep their decisions. The inputs are the same on every rank
  (gathered logits, rank 0's tree, the requests' own generators), so every rank fails the same
  requests; refengine.rank checks that they did.
Must not talk to queues or processes (refengine.rank does).
"""

from __future__ import annotations

import os
import time
import warnings
import zlib
from typing import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from torch.profiler import record_function

from probes.adaptive_policy import Schedule
from probes.names import (DRAFT, DRAFT_EXTEND, OTHER, PREFILL, R_DRAFT_TOKENS, R_PHASE_MS, SHARDED, VERIFY, VERIFY_SAMPLE)
from refengine import spec
from refengine.comm import PHASES, Communicator
from refengine.graphs import GROUP, LOCAL, GraphCache, chain_tail, graphed_forward, resolve_mode
from refengine.roles import Roles, roles_for
from refengine.config import EngineOptions, ModelLimits, SpecConfig, simulator
from refengine.draft import DraftPlacement
from refengine.messages import GenRequest, GenUpdate, SpecStats
from refengine.models.layers import causal_meta, fuse_projections
from refengine.tp import apply_tp_target

ONE_AT_A_TIME_ENV = "SPECDECODE_PREFILL_ONE_AT_A_TIME"
"""=1: prefill each waiting request in its own forward, all in the same step, as the engine did
before it batched prefills: the "before" arm of benchmarks/prefill_ttft.py, side by side."""

FAULT_ENV = "SPECDECODE_FAULT_DECODE_RID"
"""A request whose id starts with this value fails in verify_sample, on every rank: the fault the
per-request isolation tests inject into a real server (unset: nothing is checked)."""

PREFILL_GRAPH_MAX = 1024
"""Longer prompts prefill eagerly (one graph per width bucket up to here; each holds its own
activations in a private memory pool)."""

# SGLang's span names for our phases (ours prefixed specdecode.).
SPAN = {DRAFT: "draft", DRAFT_EXTEND: "draft_extend", VERIFY_SAMPLE: "specdecode.verify_sample",
        OTHER: "specdecode.other"}


@dataclass
class Req:
    rid: str
    row: int
    tokens: list[int]
    """Prompt + output; the last one is the root (not yet in the target KV)."""
    prompt_len: int
    params: GenRequest
    stop_ids: set[int]
    seq_len: int = 0
    """Tokens whose K/V is in the target cache (= committed length); the draft's K/V covers the
    same positions (every iteration extends the draft, tier 0 included)."""
    stats: SpecStats = field(default_factory=SpecStats)
    finished: bool = False
    gen: torch.Generator | None = None
    """Coins for verification and sampling; drawn identically on every rank."""
    draft_gen: torch.Generator | None = None
    """Coins for sampled drafts (rejection sampling); drawn only where the draft runs."""
    ahead: int = 0
    """Tokens an iteration launched but not yet read may still commit (at most; 0 when none is)."""
    launched: int = -1
    """The launch count of the last iteration this request ran in."""
    first: tuple[torch.Tensor, object, int] | None = None
    """The prefill's token while the host has not read it: (its host copy, the clock mark after
    which that copy is valid, the launch count when it was queued). Committed before any later
    token of the request (_take_firsts)."""
    forward_entry: float | None = None
    """When its first prefill forward began (epoch seconds), sent with its first token."""
    prefilled: int = 0
    """Prompt tokens whose K/V is in the caches; below prompt_len it waits in the prefill queue
    (a chunked prompt between its chunks) and no iteration runs it."""

    def coins(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.gen, dtype=torch.float64)

    def draft_gen_draw(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.draft_gen, dtype=torch.float64)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens) - self.prompt_len


class PhaseTimer:
    """Inclusive time per phase of one iteration, plus the comm part from the communicator.

    An iteration's marks and collectives are taken when it has been launched and read when its
    results are (with the overlap scheduler the next iteration is launched in between)."""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.marks: list[tuple[str, object, object]] = []

    @contextmanager
    def phase(self, name: str, span: str | None = None):
        prev = self.comm.phase
        self.comm.phase = name
        start = self.comm.clock.mark()
        with record_function(span or SPAN.get(name, f"specdecode.{name}")):
            yield
        self.marks.append((name, start, self.comm.clock.mark()))
        self.comm.phase = prev

    def take(self) -> tuple[list, tuple[list, list]]:
        """What was timed since the last take: (marks, the communicator's (pending, in-graph))."""
        marks, self.marks = self.marks, []
        return marks, self.comm.take()

    def collect(self, taken=None) -> tuple[dict[str, float], dict[str, float], dict[str, int], dict[str, int]]:
        """-> (ms, comm ms, comm calls, comm calls inside graphs) per phase, of `taken` (whose
        marks must be complete) or of everything so far (after a sync). A phase whose
        collectives ran (partly) inside graphs has no comm ms: their time is not measurable
        here (it comes from traces), and "not available" is not 0."""
        if taken is None:
            self.comm.clock.sync()
            taken = self.take()
        marks, (pending, graph) = taken
        ms = {p: 0.0 for p in PHASES}
        for name, a, b in marks:
            ms[name] += self.comm.clock.ms(a, b)
        gcalls, _ = self.comm.drain_graph(graph)
        cms, calls, _ = self.comm.drain(pending)
        return (ms, {p: cms.get(p, 0.0) for p in PHASES if not gcalls.get(p)},
                {p: calls.get(p, 0) + gcalls.get(p, 0) for p in PHASES},
                {p: gcalls[p] for p in PHASES if gcalls.get(p)})


@dataclass
class _Launched:
    """An iteration whose GPU work is queued and whose results the host has not read yet."""

    n: int                      # launch count: which iteration a request was last launched in
    reqs: list[Req]
    cfg: SpecConfig
    n_tok: int
    host_s: float               # host seconds its launch took (from the command before it)
    t_launch: float             # wall-clock (epoch seconds) when its launch began: matches traces
    results: torch.Tensor       # [B, 2 + s + 1]: accepted, bonus, tokens on the path (host memory)
    done: object                # the clock mark after the results' copy: wait on it, then read
    timed: tuple                # PhaseTimer.take() of this iteration
    captures: list


class _GraphedHead:
    """Stands in for the draft head inside refengine.spec's functions: its forwards go through
    the engine's graph cache under `phase` (draft_step or draft_extend) and the placement."""

    def __init__(self, engine: "Engine", phase: str):
        d = engine.draft
        self.engine, self.phase, self.head, self.kv = engine, phase, d.head, d.kv
        self.placement = d.placement
        self.scope = GROUP if (d.placement == SHARDED and engine.world > 1) else LOCAL
        self.d2t = self.head.d2t

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.head.to_target_ids(draft_ids)

    def __call__(self, ids, hidden, meta, kv):
        assert kv is self.kv, "a graphed head runs over its placement's own KV pool"
        head = self.head
        return graphed_forward(self.engine.graphs, self.phase, self.placement, self.scope, ids, hidden, meta,
                               self.engine.pad_row, lambda i, h, m: head(i, h, m, kv))


class Engine:
    def __init__(self, opts: EngineOptions, comm: Communicator, target, head, device, dtype: torch.dtype):
        self.opts, self.comm, self.device, self.dtype = opts, comm, device, dtype
        self.rank, self.world = comm.rank, comm.world
        self.max_topk = 8
        self.max_draft_tokens = 64
        self.rows = opts.max_running_requests
        self.row_len = opts.context_length + self.max_draft_tokens + self.max_topk + 8
        # One spare KV-pool row past the requests' rows: padded graph rows read and write only it.
        self.pad_row = self.rows
        full_embed = None
        if head is not None:
            # A full-vocabulary copy of the shared embedding for unsharded placements.
            full_embed = torch.nn.Embedding.from_pretrained(
                target.model.embed_tokens.weight.detach().clone(), freeze=True).to(device, dtype)
        self.target = fuse_projections(apply_tp_target(target.to(device, dtype).eval(), comm))
        prepare_head = None
        self.chain_tail = chain_tail
        if opts.enable_torch_compile:
            from refengine.compiled import compile_chain_tail, compile_models
            mode = opts.torch_compile_mode
            if mode == "auto":
                # SGLang's default and its override variable (cuda_graph_runner.py).
                mode = os.environ.get("SGLANG_TORCH_COMPILE_MODE") or (
                    "max-autotune-no-cudagraphs" if self.device.type == "cuda" else "default")
            prepare_head = compile_models(self.target, comm, mode, opts.torch_compile_max_bs,
                                          opts.torch_compile_backend)
            self.chain_tail = compile_chain_tail(backend=opts.torch_compile_backend, mode=mode)
        self.kv = self.target.make_kv(self.rows + 1, self.row_len, dtype, device)
        self.eos = set(target.config.eos_token_ids)
        self.draft: DraftPlacement | None = None
        if head is not None:
            head = head.to(device, dtype).eval()
            self.draft = DraftPlacement(head, full_embed, self.target.model.embed_tokens, comm,
                                        self.rows + 1, self.row_len, dtype, device, prepare=prepare_head)
        self.simulate = simulator(opts)
        self.sim_gen = torch.Generator().manual_seed(opts.random_seed + 17)
        self.sim_alphas: torch.Tensor | None = None   # this iteration's [B, s] curve rows (_accept sets it)
        self.config = SpecConfig(steps=0, topk=1, num_draft_tokens=1, placement=SHARDED, epoch=-1)
        self.roles: Roles = roles_for(0, 1, False)
        """The drafter and verifier of self.config (refengine.roles), chosen when it is applied."""
        self.adaptive: Schedule | None = None
        """The adaptive controller (config.adaptive set): consulted at each launch, fed at each read."""
        self.reqs: dict[str, Req] = {}
        self.waiting: list[Req] = []
        """SGLang's waiting queue: requests (in self.reqs, with a row) whose prompt is not all
        prefilled, in arrival order; a chunked prompt stays at its head between its chunks."""
        self._one_at_a_time = os.environ.get(ONE_AT_A_TIME_ENV) == "1"
        self._fault_rid = os.environ.get(FAULT_ENV) or None
        self._decode_failed: list[GenUpdate] = []
        """Error updates of requests a launch failed (_fail_in_decode), returned by the next step."""
        self.free_rows = list(range(self.rows))[::-1]
        self.iteration = 0
        self.timer = PhaseTimer(comm)
        mode, why = resolve_mode(opts.cuda_graph, str(device), comm.emulated)
        self.graphs = GraphCache(mode, comm, self.rows, self.row_len, max_graphs=opts.cuda_graph_max_graphs,
                                 time_replays=opts.cuda_graph_timing, off_reason=why)
        self._since: float | None = None
        """Start of work done between iterations (prefill, config), counted in the next record."""
        self.overlap = not opts.disable_overlap_schedule
        self.inflight: _Launched | None = None
        """With the overlap scheduler: the iteration launched last, read after the next launch."""
        self._launches = 0
        self._admit_s = 0.0
        """Host time of admissions made inside step(), not yet in a launch's wall."""
        self._pinned = self.device.type == "cuda"
        # Diagnostics (benchmarks/gpu_smoke.py): count the host's waits for the GPU per step.
        self._count_syncs = self._pinned and os.environ.get("SPECDECODE_COUNT_SYNCS") == "1"
        self._rows_key: tuple[int, ...] = ()
        self._rows_dev: torch.Tensor | None = None
        # Per KV-pool row, on the device: the committed length and the root (the last token, not
        # yet in the KV). An iteration reads them and writes the next ones, so the next iteration
        # can be launched before the host has read this one's results.
        self.row_seq = torch.zeros(self.rows + 1, dtype=torch.long, device=device)
        self.row_root = torch.zeros(self.rows + 1, dtype=torch.long, device=device)

    def compiled_graphs(self) -> int | None:
        """Graphs torch.compile has built on this rank (None when compile is off): a count that
        grows after warm-up means a recompile on the hot path."""
        if not self.opts.enable_torch_compile:
            return None
        from refengine.compiled import recompiles
        return recompiles()

    # -- limits and configuration ----------------------------------------------------------------
    def limits(self) -> ModelLimits:
        hc = self.draft.full.config if self.draft else None
        return ModelLimits(tp_size=self.world, draft_heads=hc.num_attention_heads if hc else 1,
                           draft_kv_heads=hc.num_key_value_heads if hc else 1, has_draft=self.draft is not None,
                           max_topk=self.max_topk, max_draft_tokens=self.max_draft_tokens)

    def apply_config(self, cfg: SpecConfig) -> None:
        """Between iterations, on every rank at once. Placement switches move the draft state."""
        self._since = self._since or time.perf_counter()
        if self.draft is not None:
            with self.timer.phase(OTHER, "specdecode.set_config"):
                self.draft.place(cfg.placement)
        if cfg.adaptive is None:
            self.adaptive = None
        elif self.adaptive is None or cfg.adaptive != self.config.adaptive:
            # A new schedule starts fresh (every tier at the starting step, warm-up again), as at launch.
            self.adaptive = Schedule({int(k): v for k, v in cfg.adaptive.items()}, cfg.steps, cfg.pinned)
        else:
            self.adaptive.pinned = cfg.pinned      # the policy's state resumes as it was after an unpin
        self.config = cfg
        self.roles = roles_for(cfg.steps, cfg.topk, self.simulate is not None)

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, req: GenRequest) -> GenUpdate | None:
        """add_requests of one request: its refusal or failure, or None."""
        ups = self.add_requests([req])
        return ups[0] if ups else None

    def add_requests(self, reqs: list[GenRequest]) -> list[GenUpdate]:
        """Queue requests for prefill, then run one prefill batch over the waiting ones
        (_prefill_waiting); returns the refusals and failures. A prefilled request's first token
        stays on the device (row_root) and reaches the host with the next read (_take_firsts),
        so an admission never waits for the GPU, as SGLang's overlapped prefill does not."""
        refused = [u for u in (self._queue(req) for req in reqs) if u is not None]
        return refused + self._prefill_waiting()

    def _queue(self, req: GenRequest) -> GenUpdate | None:
        """Check one request and put it at the end of the prefill queue with its row; or its refusal."""
        if not req.input_ids:
            return GenUpdate(req.rid, [], True, "error", error="empty prompt")
        # Parameters a tensor or generator cannot hold fail this request alone (raised below,
        # they would end every rank); the check is pure, so every rank refuses alike.
        bad = req.problem(self.target.config.vocab_size)
        if bad is None and req.simulate_accept and self.simulate is None:
            bad = "simulate_accept needs a launch with the acceptance simulator (--speculative-simulate-accept)"
        if bad is not None:
            return GenUpdate(req.rid, [], True, "error", error=bad)
        budget = len(req.input_ids) + req.max_new_tokens + self.max_draft_tokens + 2
        if budget > self.row_len or len(req.input_ids) + req.max_new_tokens > self.opts.context_length:
            return GenUpdate(req.rid, [], True, "error", prompt_tokens=len(req.input_ids),
                             error=f"prompt ({len(req.input_ids)}) + max_new_tokens ({req.max_new_tokens}) "
                                   f"exceeds the context length {self.opts.context_length}")
        if req.rid in self.reqs:
            return GenUpdate(req.rid, [], True, "error", error=f"duplicate request id {req.rid!r}")
        if not self.free_rows:
            return GenUpdate(req.rid, [], True, "error", error="no free slot (max_running_requests)")
        # SGLang's _check_token_based_finish: ignore_eos ignores stop_token_ids too.
        stop = set() if req.ignore_eos else set(req.stop_token_ids) | self.eos
        r = Req(req.rid, self.free_rows.pop(), list(req.input_ids), len(req.input_ids), req, stop)
        # Seeds from the request or (engine seed, rid): crc32, not hash(), which differs per process.
        seed = req.seed if req.seed is not None else zlib.crc32(req.rid.encode()) ^ self.opts.random_seed
        r.gen = torch.Generator().manual_seed(seed)
        r.draft_gen = torch.Generator().manual_seed(seed + 1)
        self.reqs[r.rid] = r
        self.waiting.append(r)
        return None

    def _schedule_prefill(self, max_requests: int | None = None) -> list[tuple[Req, int]]:
        """The next prefill batch as SGLang 0.5.23's PrefillAdder builds it
        (managers/schedule_policy.py; scheduler.py:4157-4327): the chunked request's next chunk
        first, then the waiting requests in arrival order (FCFS), each charged to the chunk
        budget (--chunked-prefill-size) and the input budget (--max-prefill-tokens). A request
        that does not fit the chunk budget whole takes what is left of it and stays the one
        chunked request (:1646-1676); the batch ends there or when a budget is spent
        (budget_state, :874-893). Without chunking the first request may exceed the input budget
        (:1627-1633); at most `max_requests` requests (SGLang's prefill_max_requests, :1398-1399).
        -> [(request, tokens to prefill now)]."""
        chunk = self.opts.chunk_size()
        rem_chunk = chunk if chunk > 0 else None
        rem_input = self.opts.max_prefill_tokens
        batch: list[tuple[Req, int]] = []
        for r in self.waiting:
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                break
            if max_requests is not None and len(batch) >= max_requests:
                break
            left = r.prompt_len - r.prefilled
            if rem_chunk is None and batch and left >= rem_input:
                break
            take = left if rem_chunk is None else min(left, rem_chunk)
            batch.append((r, take))
            rem_input -= take
            if rem_chunk is not None:
                rem_chunk -= take
            if take < left:
                break
        return batch

    def _prefill_waiting(self) -> list[GenUpdate]:
        """One prefill batch; with $SPECDECODE_PREFILL_ONE_AT_A_TIME=1 a batch per waiting
        request instead, one after the other. -> failures."""
        if not self._one_at_a_time:
            return self._prefill_batch()
        failed: list[GenUpdate] = []
        for _ in range(len(self.waiting)):
            failed += self._prefill_batch(max_requests=1)
        return failed

    def _prefill_batch(self, max_requests: int | None = None) -> list[GenUpdate]:
        """One prefill batch (_schedule_prefill): the target over every chunk in one forward,
        the first token of each request whose prompt it completes, and the draft's
        prefill-extend over the same chunks in one forward; -> failures (a sampled first token
        that cannot be drawn fails its request alone)."""
        batch = self._schedule_prefill(max_requests)
        if not batch:
            return []
        self._since = self._since or time.perf_counter()
        now = time.time()
        for r, _ in batch:
            if r.forward_entry is None:
                r.forward_entry = now
        reqs = [r for r, _ in batch]
        starts = [r.prefilled for r in reqs]
        lens = [take for _, take in batch]
        done = [i for i, r in enumerate(reqs) if r.prefilled + lens[i] == r.prompt_len]
        rows = self._h2d([r.row for r in reqs], torch.long)
        failed: list[GenUpdate] = []
        with self.timer.phase(PREFILL, "specdecode.prefill"):
            hidden, aux, meta = self._prefill_forward(reqs, starts, lens, rows)
            for r, take in batch:
                r.prefilled += take
            firsts = None
            if done:
                sel = self._h2d(done, torch.long)
                last = self.target.logits(hidden[sel, self._h2d([lens[i] - 1 for i in done], torch.long)][:, None])
                firsts = last[:, 0].argmax(-1)
                for j, i in enumerate(done):
                    r = reqs[i]
                    if r.params.temperature <= 0:
                        continue
                    try:
                        firsts[j : j + 1] = self._first_token(r.params, r, last[j : j + 1])
                    except (RuntimeError, ValueError, OverflowError) as e:
                        # Sampling runs on the gathered logits, identical on every rank, so every
                        # rank fails this request alike.
                        failed.append(GenUpdate(r.rid, [], True, "error", prompt_tokens=r.prompt_len,
                                                error=f"sampling the first token failed: {type(e).__name__}: {e}"))
                # Index copies between device tensors: a pageable scalar copied into the device
                # tensor waits for the whole stream (on the H200, 11 ms an admission).
                done_rows = rows[sel]
                self.row_seq[done_rows] = self._h2d([reqs[i].prompt_len for i in done], torch.long)
                self.row_root[done_rows] = firsts
        if self.draft is not None:
            # SGLang's _draft_extend_for_prefill, whatever the steps: tier 0 keeps the draft warm.
            with self.timer.phase(PREFILL, "specdecode.prefill_draft_extend"):
                self._prefill_extend(reqs, starts, lens, done, rows, meta, aux, firsts)
        self.waiting = [r for r in self.waiting if r.prefilled < r.prompt_len]
        gone = {u.rid for u in failed}
        if done:
            host = self._d2h(firsts)
            mark = self.comm.clock.mark()
            for j, i in enumerate(done):
                r = reqs[i]
                if r.rid in gone:
                    self.reqs.pop(r.rid, None)
                    self.free_rows.append(r.row)
                    continue
                r.seq_len = r.prompt_len
                # Until it is read the request counts one token ahead: an iteration may run it (its
                # root is on the device), and one with max_new_tokens 1 is never launched (_runnable).
                r.first, r.ahead = (host[j : j + 1], mark, self._launches), 1
        return failed

    def _first_token(self, req: GenRequest, r: Req, last: torch.Tensor) -> torch.Tensor:
        """The prefill's first output token [1], left on the device."""
        if req.temperature > 0:
            probs = spec.sampling_probs(last, self._h2d([req.temperature], torch.float32),
                                        self._h2d([req.top_k], torch.long), self._h2d([req.top_p], torch.float64))
            return spec.sample_from(probs[:, 0], self._to_dev(r.coins(1)))
        return last[0, 0].argmax(-1, keepdim=True)

    def _take_firsts(self, force: bool = False) -> list[GenUpdate]:
        """Commit the prefill tokens the host has not read yet, before any later token of those
        requests. Only those queued before the latest launch, unless `force`: waiting for one
        queued after it would leave the GPU with nothing queued behind the wait."""
        updates = []
        for r in [r for r in self.reqs.values() if r.first is not None]:
            host, mark, at = r.first
            if at >= self._launches and not force:
                continue
            r.first = None
            self.comm.clock.wait(mark)
            if r.launched < 0:
                r.ahead = 0
            u = self._commit_tokens(r, [int(host[0])])
            if u is not None:
                u.forward_entry = r.forward_entry
                updates.append(u)
            if r.finished and r.launched < 0:
                # Never launched: nothing on the GPU uses its row. (A launched one is freed by the
                # read of that iteration, whose results are then dropped.)
                self.reqs.pop(r.rid)
                self.free_rows.append(r.row)
        return updates

    def _prefill_width(self, n: int) -> int | None:
        """The padded width a prefill batch of at most n tokens per row is run at through the graph
        cache (powers of two from 16, up to PREFILL_GRAPH_MAX), or None: eagerly (graphs off, a
        longer chunk)."""
        if not self.graphs.enabled:
            return None
        t = 16
        while t < n:
            t *= 2
        return t if t <= min(PREFILL_GRAPH_MAX, self.row_len) else None

    def _prefill_forward(self, reqs: list[Req], starts: list[int], lens: list[int], rows: torch.Tensor):
        """The target over each request's next chunk, tokens[start : start + len], at positions
        start.. in one forward -> (hidden [B, W, H], aux [B, W, 3H], the attention meta); their K/V
        at those slots.

        Rows are right-padded to a common width W (the longest chunk; with graphs its width
        bucket, replayed as one graph per (batch, width) bucket, never compiled:
        graphs.UNCOMPILED_PHASES). Eagerly a prompt is one launch per op, 32 layers deep: on the
        H200 an 8B prefill took 56-62 ms of host time with the GPU mostly idle
        (benchmarks/results/overlap_h200.md). Pad tokens come after a row's chunk, so causal
        attention keeps them out of its real rows; their K/V land past the chunk (positions
        clamped inside the context), in slots every later forward writes before it reads them."""
        longest = max(lens)
        w = self._prefill_width(longest) or longest
        # Every pad position of a row is past its chunk, and ctx - 1 is past every row's chunk.
        ctx = self._bucket(max(s + w for s in starts))
        ids = [r.tokens[s : s + n] + [0] * (w - n) for r, s, n in zip(reqs, starts, lens)]
        positions = (self._h2d(starts, torch.long)[:, None] + torch.arange(w, device=self.device)[None]).clamp(
            max=ctx - 1)
        meta = causal_meta(rows, positions, ctx)
        ids_dev = self._h2d(ids, torch.long)
        if self._prefill_width(longest) is None:
            hidden, aux = self.target(ids_dev, meta, self.kv)
        else:
            scope = GROUP if self.world > 1 else LOCAL
            hidden, aux = graphed_forward(self.graphs, PREFILL, "-", scope, ids_dev, None, meta, self.pad_row,
                                          lambda i, _h, m: self.target(i, m, self.kv))
        return hidden, aux, meta

    def abort(self, rid: str) -> GenUpdate | None:
        r = self.reqs.pop(rid, None)
        if r is None:
            return None
        if r in self.waiting:
            self.waiting.remove(r)
        self.free_rows.append(r.row)
        return self._final(r, [], "abort")

    # -- one decode iteration --------------------------------------------------------------------
    def begin_command(self) -> None:
        """Rank 0's next command is about to be broadcast: the iteration it may start is timed
        from here, so the broadcast and config changes count in that iteration's `other` and
        prefills in its `prefill`. What was timed while no request ran (idle heartbeats, an idle
        config change) belongs to no iteration and is dropped, or it would show up as comm larger
        than wall."""
        if not self.busy:
            self.timer.collect()
            self._since = None
        # A start still pending (a step that admitted but launched nothing) stays: its broadcast
        # and prefill belong to the next launch's record with everything after them.
        self._since = self._since or time.perf_counter()

    @property
    def busy(self) -> bool:
        """A request is running or an iteration's results are still to be read."""
        return self.inflight is not None or any(not r.finished for r in self.reqs.values())

    def _runnable(self) -> list[Req]:
        """The requests the next iteration runs: every running one, except those that the
        iteration in flight finishes by length for certain (it commits at least one token)."""
        return [r for r in self.reqs.values() if not r.finished and r.prefilled >= r.prompt_len
                and not (r.ahead and r.completion_tokens + 1 >= r.params.max_new_tokens)]

    @torch.no_grad()
    def step(self, admit: Callable[[], None] | None = None) -> tuple[list[GenUpdate], dict | None]:
        """One iteration -> (updates, phase record or None).

        Without overlap: launch an iteration over every running request and read its results.
        With the overlap scheduler (SGLang's default): launch the next iteration, then read the
        one in flight, whose GPU work covered this host work; a request that the read finishes
        ran one more iteration on the GPU, whose results are dropped.
        `admit` (the rank's add_request calls) runs right after the launch: a prefill's host work
        then overlaps two queued iterations instead of delaying the next launch (on the H200 an
        admission between iterations left the GPU idle while it was launched); the new requests
        join the iteration after."""
        if self._count_syncs:
            return self._counting_syncs(lambda: self._step(admit))
        return self._step(admit)

    def _step(self, admit: Callable[[], None] | None = None) -> tuple[list[GenUpdate], dict | None]:
        reqs = self._runnable()
        nxt = self._launch(reqs) if reqs else None
        failed: list[GenUpdate] = []
        prefill = admit is not None or bool(self.waiting)
        if prefill:
            since, t = self._since, time.perf_counter()
            if admit is not None:
                admit()                 # add_requests: queues and runs the next prefill batch
            else:
                failed = self._prefill_waiting()    # the next chunk, or what the budget left waiting
            # The admission's host time goes in the wall of the next launch, whose record holds
            # its prefill's phase times: from a start mark still pending (nothing was launched),
            # else added (the loop's next begin_command would overwrite add_request's mark).
            self._since = since
            if since is None:
                self._admit_s += time.perf_counter() - t
        # Nothing queued and no prefill: a first token still unread is all that is left.
        idle = nxt is None and not prefill
        if not self.overlap:
            updates, record = self._read(nxt) if nxt is not None else (self._take_firsts(idle), None)
        else:
            prev, self.inflight = self.inflight, nxt
            updates, record = (self._read(prev) if prev is not None
                               else (self._take_firsts(idle and self.inflight is None), None))
        failed, self._decode_failed = failed + self._decode_failed, []
        return failed + updates, record

    def _counting_syncs(self, fn):
        """fn() with torch's sync debug mode on: every call that makes the host wait for the
        stream warns; the count goes in the record as `syncs` (the read's own event wait, which
        the debug mode does not see, counted as one)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                updates, record = fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        if record is not None:
            syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
            record["syncs"] = len(syncs) + 1
            if syncs:
                record["sync_calls"] = syncs[:8]
        return updates, record

    def drain(self) -> tuple[list[GenUpdate], dict | None]:
        """Read the iteration in flight, if any: before a setting changes (it ran the old one
        and its record says so) and at shutdown."""
        prev, self.inflight = self.inflight, None
        updates, record = self._read(prev) if prev is not None else ([], None)
        return updates + self._take_firsts(force=True), record

    def _launch(self, reqs: list[Req]) -> _Launched:
        """Queue one iteration's work over `reqs`; nothing here waits for the device."""
        t0 = min(time.perf_counter(), self._since or float("inf"))
        self._since = None
        cfg = self.config
        if self.adaptive is not None:
            # The tier for this batch size, from what the host has read so far (with the overlap
            # scheduler the iteration in flight has not fed the policy yet: SGLang's one-iteration lag).
            steps = self.adaptive.steps_for(len(reqs))
            if steps != cfg.steps:
                cfg = replace(cfg, steps=steps, num_draft_tokens=steps + 1)   # topk is 1 under adaptive
        s, k = cfg.steps, cfg.topk
        roles = self.roles if cfg is self.config else roles_for(s, k, self.simulate is not None)
        # Steps 0 is SGLang's tier 0: a one-token verify (N = 1) and, below, a draft-extend.
        n_tok = cfg.num_draft_tokens if s > 0 else 1
        b = len(reqs)
        rows = self._rows([r.row for r in reqs])
        seq, roots = self.row_seq[rows], self.row_root[rows]
        # Whether anything samples is known on the host (a device read is a sync).
        sampled = any(r.params.temperature > 0 for r in reqs)
        temps = self._h2d([r.params.temperature for r in reqs], torch.float32) if sampled else None
        rejection = sampled and s > 0 and k == 1 and self.opts.speculative_use_rejection_sampling
        # The host's lengths lag the device's by the iteration in flight: bound them.
        ctx = self._bucket(max(r.seq_len + r.ahead for r in reqs) + max(n_tok, s * k) + 1)
        q = None
        if s > 0:
            with self.timer.phase(DRAFT):
                tree, q = self._draft(roles, cfg, reqs, rows, seq, roots, temps, ctx, rejection)
        with self.timer.phase(VERIFY, f"step[VERIFY bs={b}]"):
            if s > 0:
                if self.world > 1:
                    # Every rank must feed the target identical tokens: rank 0's tree wins.
                    tree = self.comm.broadcast(tree.contiguous(), 0)
                    if rejection:
                        q = self.comm.broadcast(q.contiguous(), 0)
                tokens, parents, depth = tree[:, 0], tree[:, 1], tree[:, 2]
                meta = (causal_meta(rows, seq[:, None] + depth, ctx) if k == 1
                        else spec.tree_meta(rows, seq, parents, depth, ctx, levels=s))
            else:
                tokens = roots[:, None]
                parents = torch.full_like(tokens, -1)
                meta = causal_meta(rows, seq[:, None], ctx)
            logits, aux = self._verify_forward(tokens, meta)
        with self.timer.phase(VERIFY_SAMPLE):
            path, accepted, bonus, bad = self._accept(roles, reqs, tokens, parents, logits, temps, q, sampled,
                                                      rejection, s)
            for i, why in bad.items():
                self._fail_in_decode(reqs[i], why)
            if k > 1 and s > 0:
                # Tree: move the accepted nodes' K/V to the front of the window (slot seq+t).
                t_idx = torch.arange(s + 1, device=self.device)[None]
                src = seq[:, None] + torch.where(path >= 0, path, t_idx)
                self.kv.copy_slots(rows, src, seq[:, None] + t_idx)
            tok_path = tokens.gather(1, path.clamp(min=0))
            self.row_seq[rows] = seq + accepted + 1
            self.row_root[rows] = bonus
            # One device-to-host copy of the iteration's decisions, read later.
            results = self._d2h(torch.cat([accepted[:, None], bonus[:, None], tok_path], 1))
        if self.draft is not None:
            # Tier 0 included (SGLang's eagle_worker_v2 forward_batch_generation): the draft
            # stays warm, so nothing is caught up when drafting resumes.
            with self.timer.phase(DRAFT_EXTEND):
                self._extend(rows, seq, tokens, path, accepted, bonus, aux, n_tok, ctx)
        self._launches += 1
        for r in reqs:
            r.ahead, r.launched = s + 1, self._launches
        done = self.timer.marks[-1][2]
        host_s = time.perf_counter() - t0
        t_launch = time.time() - host_s
        host_s, self._admit_s = host_s + self._admit_s, 0.0
        return _Launched(self._launches, reqs, cfg, n_tok, host_s, t_launch, results, done, self.timer.take(),
                         [e.as_dict() for e in self.graphs.drain_events()])

    def _read(self, f: _Launched) -> tuple[list[GenUpdate], dict]:
        """Wait for a launched iteration, commit its tokens -> (updates, phase record)."""
        t_read = time.perf_counter()
        self.comm.clock.wait(f.done)
        got = f.results.tolist()
        cfg, s, k = f.cfg, f.cfg.steps, f.cfg.topk
        updates, committed, acc_l, dropped = self._take_firsts(), 0, [], 0
        ctx_l: list[int] = []     # each request's context before this commit, aligned with acc_l
        with record_function("specdecode.commit"):   # host work: in `other`, hidden when overlapped
            for r, g in zip(f.reqs, got):
                if r.launched == f.n:
                    r.ahead = 0
                if r.finished:
                    dropped += 1        # finished by the iteration before (or aborted)
                    continue
                j = g[0]
                acc_l.append(j)
                ctx_l.append(r.seq_len)
                if self.draft is not None:
                    self._count(r, j, f.n_tok)
                r.seq_len += j + 1
                u = self._commit_tokens(r, g[3: 3 + j] + [g[1]])
                committed += j + 1
                if u is not None:
                    updates.append(u)
        if self.adaptive is not None and cfg.adaptive is not None:
            self.adaptive.feed(len(f.reqs), acc_l)      # the tier the launch chose for this batch size
        for r in f.reqs:
            if r.finished and self.reqs.get(r.rid) is r:
                self.reqs.pop(r.rid)
                self.free_rows.append(r.row)
        ms, cms, calls, gcalls = self.timer.collect(f.timed)
        captures = f.captures
        if captures and self.rank == 0 and self.opts.cuda_graph_log:
            for c in captures:
                print(f"refengine: graph {'captured' if c['ok'] else 'capture FAILED'} {c['phase']} "
                      f"{c['placement']} rows={c['rows']} shape={c['shape']} in {c['ms']:.1f} ms"
                      + (f" ({c['reason']})" if c["reason"] else ""), flush=True)
        # The host time of this iteration's launch and read (overlapped, the next launch runs
        # between them and is its own iteration's): the records' walls add up to the busy time,
        # and the wait for the GPU is in the read.
        wall = (f.host_s + time.perf_counter() - t_read) * 1e3
        ms[OTHER] += max(0.0, wall - sum(ms.values()))
        self.iteration += 1
        record = {"t": time.time(), "t_launch": f.t_launch, "epoch": cfg.epoch, "steps": s, "topk": k,
                  R_DRAFT_TOKENS: cfg.num_draft_tokens, "placement": cfg.placement, "bs": len(f.reqs),
                  "committed": committed, "wall_ms": wall, R_PHASE_MS: ms, "comm_ms": cms,
                  "comm_calls": calls, "accepted": acc_l, "ctx": ctx_l,
                  # the controller chose these steps (a pinned tier is the operator's choice)
                  "adaptive": cfg.adaptive is not None and cfg.pinned is None,
                  "simulated": self.simulate is not None and s > 0,
                  "emulated_comm": self.comm.emulated, "graph_mode": self.graphs.mode,
                  # A capture makes this iteration slow for a reason that is not the config: the
                  # A/B readout and cost fits must skip records with capture = true.
                  "capture": bool(captures)}
        if captures:
            record["captures"] = captures
        if gcalls:
            record["comm_calls_in_graph"] = gcalls
        if dropped:
            record["dropped"] = dropped
        return updates, record

    # -- host <-> device, without waiting ---------------------------------------------------------
    def _rows(self, rows: list[int]) -> torch.Tensor:
        """The batch's KV-pool rows on the device, copied only when the batch changed."""
        key = tuple(rows)
        if key != self._rows_key or self._rows_dev is None:
            self._rows_key, self._rows_dev = key, self._h2d(rows, torch.long)
        return self._rows_dev

    def _h2d(self, values, dtype: torch.dtype) -> torch.Tensor:
        return self._to_dev(torch.tensor(values, dtype=dtype))

    def _to_dev(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device. From pinned memory and non-blocking on CUDA: a plain copy
        from pageable memory waits for the whole stream, i.e. for the iteration in flight."""
        if not self._pinned:
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _d2h(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor's copy in host memory, valid once the clock's next mark has run."""
        if not self._pinned:
            return t.to("cpu")
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        return out

    # -- graphed forwards ------------------------------------------------------------------------
    def _head(self, phase: str) -> "_GraphedHead":
        return _GraphedHead(self, phase)

    def _verify_forward(self, tokens: torch.Tensor, meta) -> tuple[torch.Tensor, torch.Tensor]:
        """The target over the verify tokens -> (logits [B, N, V], aux [B, N, 3H])."""
        def fn(ids, _hidden, m):
            hidden, aux = self.target(ids, m, self.kv)
            return self.target.logits(hidden), aux
        scope = GROUP if self.world > 1 else LOCAL
        logits, aux = graphed_forward(self.graphs, VERIFY, "-", scope, tokens, None, meta, self.pad_row, fn)
        return logits, aux

    def _draft(self, roles: Roles, cfg, reqs, rows, seq, roots, temps, ctx, rejection):
        """Returns ([B, 3, N] = tokens, parents, depth of the draft tree incl. the root, q or None)
        for the iteration's `cfg` (an adaptive tier's, not necessarily self.config's).
        On ranks without the draft: an empty buffer for rank 0's broadcast."""
        dev, n = self.device, cfg.num_draft_tokens
        if not self.draft.here:
            q = (torch.empty(len(reqs), cfg.steps, self.target.config.vocab_size, dtype=torch.float32, device=dev)
                 if rejection else None)
            return torch.empty(len(reqs), 3, n, dtype=torch.long, device=dev), q
        with record_function(f"step[DRAFT bs={len(reqs)}]"):
            return roles.drafter.draft(self, cfg, reqs, rows, seq, roots, temps, ctx, rejection)

    def _accept(self, roles: Roles, reqs, tokens, parents, logits, temps, q, sampled, rejection, s):
        """verify_sample's decision: (path [B, s+1] node ids, accepted [B], bonus [B], {row: why it
        failed}), by the configuration's verifier, with the sampling inputs when any request samples.

        When the batch's decision raises, each row is decided alone: a row that fails alone is
        failed (a neutral decision in its place: nothing accepted, its root as the bonus, all
        dropped when read), the others keep theirs. A failure no single row has is not a request's
        and is raised (it ends the group, as before)."""
        # Drawn once, before anything can fail: a row decided again uses the same coins.
        coins = self._to_dev(torch.stack([r.coins(s + 2) for r in reqs])) if sampled else None
        try:
            return (*self._decide(roles, reqs, tokens, parents, logits, temps, q, coins, sampled, rejection, s), {})
        except Exception as e:      # noqa: BLE001 (narrowed below: only a failure one row has alone is kept)
            batch_error = e
        decided, bad = [], {}
        for i, r in enumerate(reqs):
            one = slice(i, i + 1)
            try:
                decided.append(self._decide(roles, [r], tokens[one], parents[one], logits[one],
                                            None if temps is None else temps[one], None if q is None else q[one],
                                            None if coins is None else coins[one], sampled, rejection, s))
            except Exception as e:  # noqa: BLE001
                bad[i] = f"verify_sample failed: {type(e).__name__}: {e}"
                path = torch.full((1, s + 1), -1, dtype=torch.long, device=tokens.device)
                path[:, 0] = 0
                decided.append((path, torch.zeros(1, dtype=torch.long, device=tokens.device), tokens[one, 0]))
        if not bad:
            raise batch_error
        return (torch.cat([d[0].long() for d in decided]), torch.cat([d[1].long() for d in decided]),
                torch.cat([d[2].long() for d in decided]), bad)

    def _decide(self, roles: Roles, reqs, tokens, parents, logits, temps, q, coins, sampled, rejection, s):
        """_accept over these rows -> (path, accepted, bonus); raises what the rows' work raises."""
        if self._fault_rid is not None and any(r.rid.startswith(self._fault_rid) for r in reqs):
            raise RuntimeError(f"injected fault (${FAULT_ENV})")
        probs = None
        if self.simulate is not None and s > 0:
            self.sim_alphas = self._row_alphas(reqs, s)
        if sampled:
            v = logits.shape[-1]
            top_k = self._h2d([r.params.top_k for r in reqs], torch.long)
            top_p = self._h2d([r.params.top_p for r in reqs], torch.float64)
            filtered = any(0 < r.params.top_k < v or r.params.top_p < 1 for r in reqs)
            probs = spec.sampling_probs(logits, temps, top_k, top_p, filtered)
        return roles.verifier.decide(self, tokens, parents, logits, probs, coins, temps, q, rejection, s)

    def _fail_in_decode(self, r: Req, why: str) -> None:
        """A request whose launch failed its verify_sample: an error update (returned by this
        step) and its slot back now, as an abort does; what the GPU still runs for it is dropped."""
        self.reqs.pop(r.rid, None)
        if r in self.waiting:
            self.waiting.remove(r)
        self.free_rows.append(r.row)
        r.first = None
        r.finished = True
        self._decode_failed.append(GenUpdate(r.rid, [], True, "error", error=why, prompt_tokens=r.prompt_len,
                                             completion_tokens=r.completion_tokens, spec=self._spec_snapshot(r)))

    def _row_alphas(self, reqs, s: int) -> torch.Tensor:
        """The simulator's conditional acceptance per row and draft position [B, s] (host, float32):
        the launch's curve, or a request's own `simulate_accept` where it sent one. Rows share a
        few distinct curves, so they are looked up, not built row by row. The same on every rank:
        requests reach every rank alike."""
        own = [r.params.simulate_accept for r in reqs]
        base = self.simulate.alphas(s)
        if not any(own):
            return torch.tensor(base, dtype=torch.float32)[None].expand(len(reqs), s)
        curves: dict[tuple[float, ...], int] = {(): 0}
        table = [base]
        idx = []
        for c in own:
            if c not in curves:
                curves[c] = len(table)
                table.append([c[min(i, len(c) - 1)] for i in range(s)])
            idx.append(curves[c])
        return torch.tensor(table, dtype=torch.float32)[torch.tensor(idx)]

    def _extend(self, rows, seq, tokens, path, accepted, bonus, aux, width, ctx) -> None:
        """draft_extend over `width` (= N, 1 at tier 0) rows per request: row t holds the aux of
        the t-th committed node and the token after it (the next accepted node's, then the bonus)."""
        d = self.draft
        if d.here:
            b = rows.shape[0]
            last = path.gather(1, accepted[:, None])
            pp = torch.where(path >= 0, path, last)
            if width > pp.shape[1]:
                pp = torch.cat([pp, last.expand(b, width - pp.shape[1])], 1)
            pp = pp[:, :width]
            nxt = torch.cat([tokens.gather(1, pp)[:, 1:], bonus[:, None]], 1)
            t_idx = torch.arange(width, device=rows.device)[None]
            nxt = torch.where(t_idx >= accepted[:, None], bonus[:, None], nxt)
            feats = aux.gather(1, pp[:, :, None].expand(b, width, aux.shape[-1]))
            hid, logits = spec.draft_extend(self._head(DRAFT_EXTEND), d.kv, rows, seq, nxt, feats, accepted, ctx)
            d.hidden[rows] = hid
            d.logits[rows] = logits.to(d.logits.dtype)

    def _prefill_extend(self, reqs: list[Req], starts: list[int], lens: list[int], done: list[int],
                        rows: torch.Tensor, meta, aux: torch.Tensor, firsts: torch.Tensor | None) -> None:
        """The draft over the same chunks as the target, in one forward: at position p the id
        x_{p+1} (the first output token after a prompt's last position; a chunk that ends inside
        its prompt takes the next prompt token, as SGLang's _eagle_prefill_tail_tokens,
        speculative/eagle_utils.py:81-97) with the target's aux g_p. The last row of a completed
        prompt seeds its first cycle."""
        d = self.draft
        if not d.here:
            return
        w = aux.shape[1]
        ids = [r.tokens[s + 1 : s + n + 1] for r, s, n in zip(reqs, starts, lens)]
        ids = self._h2d([x + [0] * (w - len(x)) for x in ids], torch.long)
        head = self._head(PREFILL) if self._prefill_width(max(lens)) is not None else d.head
        select = self._h2d([n - 1 for n in lens], torch.long)
        if done:
            sel = self._h2d(done, torch.long)
            ids[sel, select[sel]] = firsts          # the first output tokens, still on the device
        hid, logits = spec.draft_extend(head, d.kv, rows, None, ids, aux, select, meta.ctx,
                                        positions=meta.positions)
        if done:
            d.hidden[rows[sel]] = hid[sel]
            d.logits[rows[sel]] = logits[sel].to(d.logits.dtype)

    # -- commit and statistics -------------------------------------------------------------------
    def _count(self, r: Req, accepted: int, n_tokens: int) -> None:
        """One verify round of `r` that ran N = `n_tokens` draft tokens (the root included; 1 at
        tier 0): the per-round truth, N - 1 proposed drafts this round. The server reports SGLang's
        figure beside it (verify rounds x (launch N - 1), tokenizer_manager.py 3156-3158)."""
        st = r.stats
        st.spec_verify_ct += 1
        st.spec_num_correct_drafts += accepted
        st.spec_num_proposed_drafts += n_tokens - 1
        while len(st.spec_correct_drafts_histogram) <= accepted:
            st.spec_correct_drafts_histogram.append(0)
        st.spec_correct_drafts_histogram[accepted] += 1

    def _commit_tokens(self, r: Req, new: list[int]) -> GenUpdate | None:
        """Append tokens, stopping at the first stop id or the token budget (a cycle can
        overshoot both: the rest is dropped)."""
        out: list[int] = []
        for t in new:
            r.tokens.append(t)
            out.append(t)
            if t in r.stop_ids:
                return self._final(r, out, "stop", matched=t)
            if r.completion_tokens >= r.params.max_new_tokens:
                return self._final(r, out, "length")
        return GenUpdate(r.rid, out, prompt_tokens=r.prompt_len, completion_tokens=r.completion_tokens,
                         spec=self._spec_snapshot(r))

    def _final(self, r: Req, out: list[int], reason: str, matched: int | None = None) -> GenUpdate:
        r.finished = True
        return GenUpdate(r.rid, out, True, reason, matched=matched, prompt_tokens=r.prompt_len,
                         completion_tokens=r.completion_tokens, spec=self._spec_snapshot(r))

    def _spec_snapshot(self, r: Req) -> SpecStats | None:
        """The statistics up to this update (a copy: the record is pickled later). Every update
        carries them, so a request the server ends early (a stop string) keeps the statistics
        of exactly the tokens it returned; None without a draft (no speculation at all)."""
        if self.draft is None:
            return None
        st = r.stats
        return SpecStats(st.spec_verify_ct, st.spec_num_correct_drafts, st.spec_num_proposed_drafts,
                         list(st.spec_correct_drafts_histogram))

    def _bucket(self, n: int) -> int:
        """Context width rounded up to a multiple of 64 (shapes repeat across iterations); with
        graphs, to the graph cache's coarser buckets, so masks need no padding."""
        if self.graphs.enabled:
            return self.graphs.ctx_for(n)
        return min((n + 63) // 64 * 64, self.row_len)
