"""One rank's engine: the models on this rank, the running requests, and one decode iteration.

Every rank runs the same Engine methods in the same order (rank 0's broadcast commands decide
which), so all ranks hold the same requests, lengths and tokens; only rank 0 reports them.
Phases are timed here: `draft`, `verify`, `verify_sample`, `draft_extend`, `other`, each with the
communicator's time inside it, under SGLang's profiler span names where SGLang has one.
Must not talk to queues or processes (refengine.rank does).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from refengine import spec
from refengine.comm import PHASES, Communicator
from refengine.config import ModelLimits, SpecConfig, EngineOptions
from refengine.draft import DraftPlacement
from refengine.messages import GenRequest, GenUpdate, SpecStats
from refengine.models.layers import causal_meta
from refengine.tp import apply_tp_target

# SGLang's span names for our phases (ours prefixed specdecode.).
SPAN = {"draft": "draft", "draft_extend": "draft_extend", "verify_sample": "specdecode.verify_sample",
        "other": "specdecode.other"}


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
    """Tokens whose K/V is in the target cache (= committed length)."""
    draft_len: int = 0
    """Positions whose draft K/V is valid; < seq_len while speculation is off (catch-up pending)."""
    pending_aux: list[torch.Tensor] = field(default_factory=list)
    """Target aux features of positions draft_len..seq_len-1, kept for the catch-up extend."""
    stats: SpecStats = field(default_factory=SpecStats)
    finished: bool = False

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens) - self.prompt_len


class PhaseTimer:
    """Inclusive time per phase of one iteration, plus the comm part from the communicator."""

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

    def collect(self) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
        self.comm.clock.sync()
        ms = {p: 0.0 for p in PHASES}
        for name, a, b in self.marks:
            ms[name] += self.comm.clock.ms(a, b)
        self.marks.clear()
        cms, calls, _ = self.comm.drain()
        return ms, {p: cms.get(p, 0.0) for p in PHASES}, {p: calls.get(p, 0) for p in PHASES}


class Engine:
    def __init__(self, opts: EngineOptions, comm: Communicator, target, head, device, dtype: torch.dtype):
        self.opts, self.comm, self.device, self.dtype = opts, comm, device, dtype
        self.rank, self.world = comm.rank, comm.world
        self.max_topk = 8
        self.max_draft_tokens = 64
        self.rows = opts.max_running_requests
        self.row_len = opts.context_length + self.max_draft_tokens + 8
        full_embed = None
        if head is not None:
            # A full-vocabulary copy of the shared embedding for unsharded placements.
            full_embed = torch.nn.Embedding.from_pretrained(
                target.model.embed_tokens.weight.detach().clone(), freeze=True).to(device, dtype)
        self.target = apply_tp_target(target.to(device, dtype).eval(), comm)
        self.kv = self.target.make_kv(self.rows, self.row_len, dtype, device)
        self.eos = set(target.config.eos_token_ids)
        self.draft: DraftPlacement | None = None
        if head is not None:
            head = head.to(device, dtype).eval()
            self.draft = DraftPlacement(head, full_embed, self.target.model.embed_tokens, comm,
                                        self.rows, self.row_len, dtype, device, self.max_topk)
        self.config = SpecConfig(steps=0, topk=1, num_draft_tokens=1, placement="sharded", epoch=-1)
        self.reqs: dict[str, Req] = {}
        self.free_rows = list(range(self.rows))[::-1]
        self.iteration = 0
        self.timer = PhaseTimer(comm)
        self._since: float | None = None
        """Start of work done between iterations (prefill, config), counted in the next record."""

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
            with self.timer.phase("other", "specdecode.set_config"):
                self.draft.place(cfg.placement)
        self.config = cfg

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, req: GenRequest) -> GenUpdate | None:
        """Prefill one request; returns its first update (or a refusal)."""
        budget = len(req.input_ids) + req.max_new_tokens + self.max_draft_tokens + 2
        if not req.input_ids:
            return GenUpdate(req.rid, [], True, "error", error="empty prompt")
        if budget > self.row_len or len(req.input_ids) + req.max_new_tokens > self.opts.context_length:
            return GenUpdate(req.rid, [], True, "error", prompt_tokens=len(req.input_ids),
                             error=f"prompt ({len(req.input_ids)}) + max_new_tokens ({req.max_new_tokens}) "
                                   f"exceeds the context length {self.opts.context_length}")
        if req.rid in self.reqs:
            return GenUpdate(req.rid, [], True, "error", error=f"duplicate request id {req.rid!r}")
        if not self.free_rows:
            return GenUpdate(req.rid, [], True, "error", error="no free slot (max_running_requests)")
        stop = set(req.stop_token_ids) | (set() if req.ignore_eos else self.eos)
        r = Req(req.rid, self.free_rows.pop(), list(req.input_ids), len(req.input_ids), req, stop)
        self._since = self._since or time.perf_counter()
        with self.timer.phase("other", "specdecode.prefill"):
            n = len(r.tokens)
            ids = torch.tensor([r.tokens], device=self.device)
            rows = torch.tensor([r.row], device=self.device)
            meta = causal_meta(rows, torch.arange(n, device=self.device)[None], n)
            hidden, aux = self.target(ids, meta, self.kv)
            first = int(self.target.logits(hidden[:, -1]).argmax(-1).item())
            r.seq_len = n
            r.pending_aux = [aux[0]]
        self.reqs[r.rid] = r
        if self.config.steps > 0:
            with self.timer.phase("other", "specdecode.prefill_draft_extend"):
                self._catch_up(r, first_token=first)
        update = self._commit_tokens(r, [first])
        if r.finished:
            self.reqs.pop(r.rid)
            self.free_rows.append(r.row)
        return update

    def abort(self, rid: str) -> GenUpdate | None:
        r = self.reqs.pop(rid, None)
        if r is None:
            return None
        self.free_rows.append(r.row)
        return self._final(r, [], "abort")

    # -- one decode iteration --------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> tuple[list[GenUpdate], dict]:
        """One decode iteration over every running request. Returns (updates, phase record)."""
        t0 = min(time.perf_counter(), self._since or float("inf"))
        self._since = None
        reqs = [r for r in self.reqs.values() if not r.finished]
        cfg = self.config
        s = cfg.steps
        b = len(reqs)
        rows = torch.tensor([r.row for r in reqs], device=self.device)
        seq = torch.tensor([r.seq_len for r in reqs], device=self.device)
        roots = torch.tensor([r.tokens[-1] for r in reqs], device=self.device)
        width = s + 1
        ctx = self._bucket(max(r.seq_len for r in reqs) + width)
        if s > 0:
            self._catch_up_all(reqs)
            with self.timer.phase("draft"):
                drafts = self._draft(rows, seq, s, ctx)
        with self.timer.phase("verify", f"step[VERIFY bs={b}]"):
            if s > 0 and self.world > 1:
                # Every rank must feed the target identical tokens: rank 0's drafts win.
                drafts = self.comm.broadcast(drafts.contiguous(), 0)
            ids = torch.cat([roots[:, None], drafts], 1) if s > 0 else roots[:, None]
            positions = seq[:, None] + torch.arange(width, device=self.device)[None]
            hidden, aux = self.target(ids, causal_meta(rows, positions, ctx), self.kv)
            logits = self.target.logits(hidden)
        with self.timer.phase("verify_sample"):
            if s > 0:
                predict, accepted = spec.verify_greedy(drafts, logits)
            else:
                predict, accepted = logits.argmax(-1), torch.zeros(b, dtype=torch.long, device=self.device)
            pred_l, acc_l = predict.tolist(), accepted.tolist()
            updates, committed = [], 0
            for i, r in enumerate(reqs):
                j = acc_l[i]
                self._count(r, j, s)
                old = r.seq_len
                r.seq_len += j + 1
                if s == 0:
                    r.pending_aux.append(aux[i, :1])
                u = self._commit_tokens(r, pred_l[i][: j + 1])
                committed += j + 1
                if u is not None:
                    updates.append(u)
                assert r.seq_len == old + j + 1
        if s > 0:
            with self.timer.phase("draft_extend"):
                self._extend(reqs, rows, seq, predict, aux, accepted, ctx)
        for r in reqs:
            if r.finished:
                self.reqs.pop(r.rid, None)
                self.free_rows.append(r.row)
        ms, cms, calls = self.timer.collect()
        wall = (time.perf_counter() - t0) * 1e3
        ms["other"] += max(0.0, wall - sum(ms.values()))
        self.iteration += 1
        record = {"t": time.time(), "epoch": cfg.epoch, "steps": s, "topk": cfg.topk,
                  "num_draft_tokens": cfg.num_draft_tokens, "placement": cfg.placement, "bs": b,
                  "committed": committed, "wall_ms": wall, "phase_ms": ms, "comm_ms": cms,
                  "comm_calls": calls, "accepted": acc_l, "simulated": False,
                  "emulated_comm": self.comm.emulated}
        return updates, record

    def _draft(self, rows, seq, steps: int, ctx: int) -> torch.Tensor:
        d = self.draft
        if not d.here:
            return torch.empty(len(rows), steps, dtype=torch.long, device=self.device)
        first = d.first[rows, 0]
        hidden = d.hidden[rows]
        with record_function(f"step[DRAFT bs={len(rows)}]"):
            return spec.draft_chain(d.head, d.kv, rows, seq, first, hidden, steps, ctx)

    def _extend(self, reqs, rows, seq, predict, aux, accepted, ctx) -> None:
        d = self.draft
        if d.here:
            hid, first, p = spec.draft_extend(d.head, d.kv, rows, seq, predict, aux, accepted, ctx)
            d.hidden[rows] = hid
            d.first[rows, : first.shape[1]] = first
            d.first_p[rows, : p.shape[1]] = p
        for r in reqs:
            r.draft_len = r.seq_len

    def _catch_up_all(self, reqs: list[Req]) -> None:
        lagging = [r for r in reqs if r.draft_len < r.seq_len]
        if lagging:
            with self.timer.phase("draft_extend", "draft_extend"):
                for r in lagging:
                    self._catch_up(r)

    def _catch_up(self, r: Req, first_token: int | None = None) -> None:
        """Extend the draft over positions draft_len..seq_len-1 (prefill, or after steps = 0):
        ids x_{p+1} with the target's aux g_p at position p."""
        aux = torch.cat(r.pending_aux, 0)[None]
        tokens = r.tokens + ([first_token] if first_token is not None else [])
        ids = torch.tensor([tokens[r.draft_len + 1: r.seq_len + 1]], device=self.device)
        assert ids.shape[1] == aux.shape[1], (ids.shape, aux.shape)
        d = self.draft
        if d.here:
            rows = torch.tensor([r.row], device=self.device)
            start = torch.tensor([r.draft_len], device=self.device)
            hid, first, p = spec.draft_extend(d.head, d.kv, rows, start, ids, aux,
                                              torch.tensor([ids.shape[1] - 1], device=self.device),
                                              self._bucket(r.seq_len + 1), self.config.topk)
            d.hidden[r.row] = hid[0]
            d.first[r.row, : first.shape[1]] = first[0]
            d.first_p[r.row, : p.shape[1]] = p[0]
        r.draft_len = r.seq_len
        r.pending_aux = []

    # -- commit and statistics -------------------------------------------------------------------
    def _count(self, r: Req, accepted: int, steps: int) -> None:
        st = r.stats
        st.spec_verify_ct += 1
        st.spec_num_correct_drafts += accepted
        st.spec_num_proposed_drafts += steps
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
        return GenUpdate(r.rid, out, prompt_tokens=r.prompt_len, completion_tokens=r.completion_tokens)

    def _final(self, r: Req, out: list[int], reason: str, matched: int | None = None) -> GenUpdate:
        r.finished = True
        return GenUpdate(r.rid, out, True, reason, matched=matched, prompt_tokens=r.prompt_len,
                         completion_tokens=r.completion_tokens, spec=r.stats)

    def kv_lengths(self) -> dict[str, tuple[int, int, int]]:
        """rid -> (target KV length, draft KV length, committed tokens) for invariant checks."""
        return {r.rid: (r.seq_len, r.draft_len, len(r.tokens) - 1) for r in self.reqs.values()}

    def _bucket(self, n: int) -> int:
        """Context width rounded up to a multiple of 64 (shapes repeat across iterations)."""
        return min((n + 63) // 64 * 64, self.row_len)
