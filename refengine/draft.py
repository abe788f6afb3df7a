"""Where the EAGLE-3 head lives on the TP group: `sharded`, `replicated` or `rank0`, and the
migration between them while requests are running.

* sharded    (SGLang): the head Megatron-split over the target's group; the shared embedding is
             the target's vocab-parallel one. 3-4 collectives per draft forward.
* replicated (DPDraft): the full head on every rank with a full-vocabulary embedding copy; no
             collective while drafting.
* rank0:     the full head on rank 0 only; the other ranks idle while rank 0 drafts.
Every rank keeps the unsharded head, so a switch re-shards from it; the draft KV and per-row
draft state are moved (all-gather / broadcast) so a switch never loses a request's context.
The head and KV pool of each layout (sharded, full) are built once and kept: captured graphs read
their memory, so a switch back reuses the graphs instead of capturing again.
Must not run any speculative step itself (refengine.spec does).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from probes.names import RANK0, REPLICATED, SHARDED
from refengine.comm import Communicator
from refengine.models.eagle3 import Eagle3Head
from refengine.models.layers import KVPool, fuse_projections
from refengine.tp import apply_tp_head


class DraftPlacement:
    """The head as currently placed, its KV pool, and per-row draft state.

    Per-row state (rows = KV-pool rows of running requests):
        hidden[row]: the pre-norm output at the last committed position (fed to the next step);
        logits[row]: the draft logits there, from which the next cycle's first level is taken
                     (argmax, top-k or a sample), so topk can change between any two iterations.
    """

    def __init__(self, full: Eagle3Head, full_embed: nn.Embedding, target_embed: nn.Module,
                 comm: Communicator, rows: int, row_len: int, dtype: torch.dtype, device,
                 prepare: Callable[[Eagle3Head], object] | None = None):
        """prepare: applied to each layout's head once it is built (torch.compile when on)."""
        self.prepare = prepare
        self.full, self.full_embed, self.target_embed = full, full_embed, target_embed
        self.comm, self.rows, self.row_len = comm, rows, row_len
        self.dtype, self.device = dtype, device
        h = full.config.hidden_size
        self.hidden = torch.zeros(rows, h, dtype=dtype, device=device)
        self.logits = torch.zeros(rows, full.config.draft_vocab_size, dtype=dtype, device=device)
        self.placement: str | None = None
        self.head: Eagle3Head | None = None
        self.kv: KVPool | None = None
        self._heads: dict[str, Eagle3Head] = {}
        self._kvs: dict[str, KVPool] = {}

    @property
    def here(self) -> bool:
        """Whether this rank runs the draft under the current placement."""
        return self.head is not None

    def place(self, placement: str) -> None:
        """Switch placement (collective: every rank calls it at the same point)."""
        if placement == self.placement:
            return
        old = self.placement
        full_k = full_v = None
        if old is not None:
            full_k, full_v = self._full_kv(old)
            if old == RANK0 and self.comm.world > 1:
                self.comm.broadcast(self.hidden, 0)
                self.comm.broadcast(self.logits, 0)
        self.placement = placement
        if placement == RANK0 and self.comm.rank != 0:
            self.head, self.kv = None, None
            return
        layout = SHARDED if placement == SHARDED and self.comm.world > 1 else "full"
        head = self._heads.get(layout)
        if head is None:
            if layout == SHARDED:
                head = apply_tp_head(copy.deepcopy(self.full), self.comm)
                head.set_embed(self.target_embed)
            else:
                head = self.full
                head.set_embed(self.full_embed)
            fuse_projections(head.midlayer)   # after TP: sharding replaces the weights it joins
            if self.prepare is not None:
                self.prepare(head)
            self._heads[layout] = head
            self._kvs[layout] = head.make_kv(self.rows, self.row_len, self.dtype, self.device)
        self.head, self.kv = head, self._kvs[layout]
        if full_k is not None:
            n = self.kv.k[0].shape[2]
            start = self.comm.rank * n if n != full_k.shape[2] else 0
            self.kv.k[0].copy_(full_k[:, :, start:start + n])
            self.kv.v[0].copy_(full_v[:, :, start:start + n])

    def _full_kv(self, old: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's copy of the full-head draft KV under the old placement."""
        cfg = self.full.config
        shape = (self.rows, self.row_len, cfg.num_key_value_heads, cfg.head_dim)
        if old == SHARDED and self.comm.world > 1:
            return (self.comm.all_gather(self.kv.k[0], dim=2), self.comm.all_gather(self.kv.v[0], dim=2))
        if old == REPLICATED or self.comm.world == 1:
            return self.kv.k[0], self.kv.v[0]
        # rank0: only rank 0 has it.
        k = self.kv.k[0] if self.kv is not None else torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = self.kv.v[0] if self.kv is not None else torch.zeros(shape, dtype=self.dtype, device=self.device)
        return self.comm.broadcast(k.contiguous(), 0), self.comm.broadcast(v.contiguous(), 0)
