"""Building blocks shared by the Llama target and the EAGLE-3 head: RMSNorm, RoPE (with Llama-3
scaling), GQA attention over a preallocated KV pool, SwiGLU MLP.

Plain modules with no tensor parallelism inside: head counts are read from weight shapes at run
time, so refengine.tp can shard the projections after construction without touching this file.
Every forward takes fixed-shape inputs plus masks (no Python loop over tokens), so the GPU path can
capture CUDA graphs over them.

Kernel count is the cost that matters at decode shapes (batch 1, a few tokens: every matmul is a
weight stream and every elementwise op a few-µs launch, ~30 per layer times 32 layers even inside
a CUDA graph), so the forward keeps it low without custom kernels: `fuse_projections` joins q/k/v
and gate/up into one matmul each (the separate weights become views of the joined one, so names,
loading and TP are unchanged and no memory is added); RoPE's cos/sin and the additive mask are
computed once per forward (cached on the AttnMeta), RoPE as one batched matmul per layer rotating q
and k together; GQA attention is two batched matmuls over grouped query heads (no repeat of K/V);
RMSNorm is torch's fused op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class AttnMeta:
    """Where one forward's tokens live in the KV pool and what they may see.

    rows:      [B]       KV-pool row of each request (one row per running request).
    positions: [B, T]    RoPE positions of the tokens.
    slots:     [B, T]    slot within the row where each token's K/V is written (== positions,
                         except for tree nodes, which sit at seq_len + node index).
    mask:      [B, T, C] True where the token may attend to slot c of its row (C = context width).
    """

    rows: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor
    # Per-forward values every layer shares (computed by the first layer that needs them).
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def ctx(self) -> int:
        return self.mask.shape[-1]

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as an additive bias [B, 1, 1, T, C] (0 visible, a large negative hidden),
        broadcast over KV heads and query groups."""
        key = ("bias", dtype)
        if key not in self.cache:
            b = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            self.cache[key] = b.masked_fill_(~self.mask, torch.finfo(dtype).min)[:, None, None]
        return self.cache[key]


def causal_meta(rows: torch.Tensor, positions: torch.Tensor, ctx: int) -> AttnMeta:
    """Tokens written at their own positions, each seeing every slot up to its position."""
    cols = torch.arange(ctx, device=positions.device)
    mask = cols[None, None, :] <= positions[:, :, None]
    return AttnMeta(rows, positions, positions, mask)


class KVPool:
    """Preallocated K/V for `layers` layers: [rows, row_len, kv_heads, head_dim] each, written by index.

    Each running request owns one row; its slot p holds the K/V of its token at position p.
    """

    def __init__(self, layers: int, rows: int, row_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (rows, row_len, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.row_len = row_len

    def write(self, layer: int, meta: AttnMeta, k: torch.Tensor, v: torch.Tensor) -> None:
        r = meta.rows[:, None].expand_as(meta.slots)
        self.k[layer][r, meta.slots] = k
        self.v[layer][r, meta.slots] = v

    def read(self, layer: int, meta: AttnMeta) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer][meta.rows, : meta.ctx], self.v[layer][meta.rows, : meta.ctx]

    def copy_slots(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """kv[row, dst] = kv[row, src] for every layer: the compaction of accepted tree nodes."""
        r = rows[:, None].expand_as(src)
        for kk, vv in zip(self.k, self.v):
            kk[r, dst] = kk[r, src].clone()
            vv[r, dst] = vv[r, src].clone()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel; it accumulates in float32 for half types, as HF Llama computes the
        # norm (HF rounds to the activation dtype before the weight multiply, this after it).
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """RoPE inverse frequencies, with Llama-3 scaling when `rope_scaling.rope_type == "llama3"`."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (only llama3)")
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    # Long wavelengths are slowed by `factor`, short ones kept, and the band between interpolated.
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling).float(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, 1, head_dim] in `dtype` (HF layout: computed in float32, then cast)."""
        ft = torch.float64 if dtype == torch.float64 else torch.float32
        freqs = positions[..., None].to(ft) * self.inv_freq.to(ft)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, :, None], emb.sin().to(dtype)[:, :, None]

    def matrix(self, meta: "AttnMeta", dtype: torch.dtype) -> torch.Tensor:
        """RoPE as a matrix per token, [B, T, head_dim, head_dim]: x @ R == x*cos + rotate_half(x)*sin
        (R = diag(cos) + J·diag(sin), J the rotate-half permutation with its sign). Built once per
        forward (every layer shares it), so each layer rotates q and k with one batched matmul
        instead of four elementwise kernels."""
        key = ("rope", id(self), dtype)
        if key not in meta.cache:
            cos, sin = self.cos_sin(meta.positions, dtype)
            hd = cos.shape[-1]
            h = hd // 2
            j = torch.zeros(hd, hd, dtype=dtype, device=cos.device)
            j[h:, :h] = -torch.eye(h, dtype=dtype, device=cos.device)
            j[:h, h:] = torch.eye(h, dtype=dtype, device=cos.device)
            meta.cache[key] = torch.diag_embed(cos[:, :, 0]) + j * sin[:, :, 0, None, :]
        return meta.cache[key]


# "grouped": two batched matmuls over query heads grouped by KV head (the default); "sdpa": torch's
# scaled_dot_product_attention with enable_gqa (whichever backend it picks for an additive mask).
# benchmarks/attention_variants.py times both inside CUDA graphs.
ATTENTION = "grouped"


class Attention(nn.Module):
    """GQA self-attention over a KV pool. `in_dim` is 2H for the EAGLE-3 midlayer."""

    def __init__(self, in_dim: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 rotary: Rotary, bias: bool = False):
        super().__init__()
        self.head_dim = head_dim
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.rotary = rotary
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None   # set by fuse()

    def fuse(self) -> None:
        """Join q/k/v into one weight; the three keep working as views of it (call after any
        .to() or TP sharding: both replace the weights and undo the fusion)."""
        self.qkv = _join(self.q_proj, self.k_proj, self.v_proj)

    def _rotated_qkv(self, x: torch.Tensor, meta: AttnMeta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (RoPE applied) and v, [B, T, heads, head_dim] each."""
        b, t, _ = x.shape
        hd = self.head_dim
        rope = self.rotary.matrix(meta, x.dtype)                # [B, T, hd, hd]
        # The fusion holds while the weights are still views of the joined one (.to() undoes it).
        if self.qkv is not None and self.qkv[0].data_ptr() == self.q_proj.weight.data_ptr():
            hq, hk = self.q_proj.weight.shape[0] // hd, self.k_proj.weight.shape[0] // hd
            qkv = F.linear(x, *self.qkv).view(b, t, -1, hd)
            qk = torch.matmul(qkv[:, :, :hq + hk], rope)        # q and k rotated in one matmul
            return qk[:, :, :hq], qk[:, :, hq:], qkv[:, :, hq + hk:]
        q, k = self.q_proj(x).view(b, t, -1, hd), self.k_proj(x).view(b, t, -1, hd)
        return torch.matmul(q, rope), torch.matmul(k, rope), self.v_proj(x).view(b, t, -1, hd)

    def forward(self, x: torch.Tensor, meta: AttnMeta, kv: KVPool, layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self._rotated_qkv(x, meta)
        hq, hk, hd = q.shape[2], k.shape[2], self.head_dim
        kv.write(layer, meta, k, v)
        keys, values = kv.read(layer, meta)                     # [B, C, kvh, hd]
        if ATTENTION == "sdpa":
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                                 attn_mask=meta.bias(q.dtype)[:, :, 0], enable_gqa=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, hq * hd))
        g, c = hq // hk, keys.shape[1]
        # Query heads grouped by their KV head: [B, kvh, g*T, hd] against K/V [B, kvh, C, hd].
        qg = q.reshape(b, t, hk, g, hd).permute(0, 2, 3, 1, 4).reshape(b, hk, g * t, hd)
        scores = torch.matmul(qg, keys.permute(0, 2, 3, 1)).view(b, hk, g, t, c)
        scores = torch.add(meta.bias(scores.dtype), scores, alpha=hd ** -0.5)
        # Half types: torch's softmax accumulates in float32 and rounds once on output.
        probs = torch.softmax(scores, dim=-1).view(b, hk, g * t, c)
        out = torch.matmul(probs, values.permute(0, 2, 1, 3))   # [B, kvh, g*T, hd]
        out = out.view(b, hk, g, t, hd).permute(0, 3, 1, 2, 4).reshape(b, t, hq * hd)
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up: tuple[torch.Tensor, None] | None = None   # set by fuse()

    def fuse(self) -> None:
        """Join gate and up into one weight (both keep working as views of it)."""
        self.gate_up = _join(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None and self.gate_up[0].data_ptr() == self.gate_proj.weight.data_ptr():
            gate, up = F.linear(x, *self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _join(*linears: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linears over the same input, the originals rebound as
    views of it, so the joined matmul and the separate ones read the same memory."""
    with torch.no_grad():
        weight = torch.cat([m.weight for m in linears])
        has_bias = linears[0].bias is not None
        bias = torch.cat([m.bias for m in linears]) if has_bias else None
        at = 0
        for m in linears:
            n = m.weight.shape[0]
            m.weight = nn.Parameter(weight[at:at + n], requires_grad=False)
            if has_bias:
                m.bias = nn.Parameter(bias[at:at + n], requires_grad=False)
            at += n
    return weight, bias


def fuse_projections(model: nn.Module) -> nn.Module:
    """Fuse every Attention's q/k/v and every MLP's gate/up in `model` (in place; inference only)."""
    for m in model.modules():
        if isinstance(m, (Attention, MLP)):
            m.fuse()
    return model
