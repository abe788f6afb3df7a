"""Tensor parallelism applied to plain models after construction (Megatron layout).

Vocab-parallel embedding (masked lookup + all-reduce) and lm_head (local vocab slice + all-gather),
column-parallel q/k/v and gate/up (by heads / intermediate rows), row-parallel o_proj and
down_proj (+ all-reduce). Every collective goes through the Communicator. The residual stream,
hence the EAGLE-3 aux features, comes out replicated on every rank.
Must not hold any placement policy: refengine.draft decides what to shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refengine.comm import Communicator
from refengine.models.eagle3 import Eagle3Head
from refengine.models.llama import LlamaForCausalLM


def _shard(n: int, rank: int, world: int, what: str) -> tuple[int, int]:
    if n % world:
        raise ValueError(f"{what} ({n}) is not divisible by tp_size {world}")
    step = n // world
    return rank * step, (rank + 1) * step


class ColumnParallelLinear(nn.Module):
    """Output rows [start, end) of a Linear; input replicated, output local (no collective)."""

    def __init__(self, full: nn.Linear, start: int, end: int):
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[start:end].clone(), requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[start:end].clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Input columns [start, end) of a Linear; partial outputs summed by an all-reduce."""

    def __init__(self, full: nn.Linear, start: int, end: int, comm: Communicator):
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[:, start:end].clone(), requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(), requires_grad=False)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.comm.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, end) of the table; ids outside look up zeros, and the all-reduce fills them."""

    def __init__(self, full: nn.Embedding, start: int, end: int, comm: Communicator):
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[start:end].clone(), requires_grad=False)
        self.start, self.end, self.comm = start, end, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        inside = (ids >= self.start) & (ids < self.end)
        local = torch.where(inside, ids - self.start, torch.zeros_like(ids))
        out = F.embedding(local, self.weight) * inside[..., None].to(self.weight.dtype)
        return self.comm.all_reduce(out)


class VocabParallelLMHead(nn.Module):
    """Vocabulary rows [start, end); the logit slices are all-gathered so every rank has them all."""

    def __init__(self, full: nn.Linear, start: int, end: int, comm: Communicator):
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[start:end].clone(), requires_grad=False)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather(F.linear(x, self.weight), dim=-1)


def _shard_attention(attn: nn.Module, heads: int, kv_heads: int, comm: Communicator) -> None:
    r, w, hd = comm.rank, comm.world, attn.head_dim
    qs, qe = _shard(heads, r, w, "attention heads")
    ks, ke = _shard(kv_heads, r, w, "KV heads")
    attn.q_proj = ColumnParallelLinear(attn.q_proj, qs * hd, qe * hd)
    attn.k_proj = ColumnParallelLinear(attn.k_proj, ks * hd, ke * hd)
    attn.v_proj = ColumnParallelLinear(attn.v_proj, ks * hd, ke * hd)
    attn.o_proj = RowParallelLinear(attn.o_proj, qs * hd, qe * hd, comm)


def _shard_mlp(mlp: nn.Module, intermediate: int, comm: Communicator) -> None:
    s, e = _shard(intermediate, comm.rank, comm.world, "intermediate_size")
    mlp.gate_proj = ColumnParallelLinear(mlp.gate_proj, s, e)
    mlp.up_proj = ColumnParallelLinear(mlp.up_proj, s, e)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, s, e, comm)


def apply_tp_target(model: LlamaForCausalLM, comm: Communicator) -> LlamaForCausalLM:
    """Shard the target in place over comm's group (no-op at world size 1)."""
    if comm.world == 1:
        return model
    cfg, r, w = model.config, comm.rank, comm.world
    vs, ve = _shard(cfg.vocab_size, r, w, "vocab_size")
    tied = cfg.tie_word_embeddings
    model.model.embed_tokens = VocabParallelEmbedding(model.model.embed_tokens, vs, ve, comm)
    for layer in model.model.layers:
        _shard_attention(layer.self_attn, cfg.num_attention_heads, cfg.num_key_value_heads, comm)
        _shard_mlp(layer.mlp, cfg.intermediate_size, comm)
    head = model.lm_head
    model.lm_head = VocabParallelLMHead(head, vs, ve, comm)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def apply_tp_head(head: Eagle3Head, comm: Communicator) -> Eagle3Head:
    """Shard the head in place the way SGLang does (placement `sharded`): fc and norms
    replicated, the midlayer Megatron-split, lm_head vocab-parallel over the draft vocabulary."""
    if comm.world == 1:
        return head
    cfg = head.config
    _shard_attention(head.midlayer.self_attn, cfg.num_attention_heads, cfg.num_key_value_heads, comm)
    _shard_mlp(head.midlayer.mlp, cfg.intermediate_size, comm)
    s, e = _shard(cfg.draft_vocab_size, comm.rank, comm.world, "draft_vocab_size")
    head.lm_head = VocabParallelLMHead(head.lm_head, s, e, comm)
    return head
