"""Building blocks shared by the Llama target and the EAGLE-3 head: RMSNorm, RoPE (with Llama-3
scaling), GQA attention over a preallocated KV pool, SwiGLU MLP.

Plain modules with no tensor parallelism inside: head counts are read from weight shapes at run
time, so refengine.tp can shard the projections after construction without touching this file.
Every forward takes fixed-shape inputs plus masks (no Python loop over tokens), so the GPU path can
capture CUDA graphs over them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

    @property
    def ctx(self) -> int:
        return self.mask.shape[-1]


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
        # Computed in float32 (float64 stays float64), as HF Llama does, then cast back.
        dt = x.dtype
        h = x.float() if dt in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


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

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        # HF layout: rotate halves, cos/sin computed in float32 then cast to the activations' dtype.
        ft = torch.float64 if q.dtype == torch.float64 else torch.float32
        freqs = positions[..., None].to(ft) * self.inv_freq.to(ft)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype)[:, :, None], emb.sin().to(q.dtype)[:, :, None]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


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

    def forward(self, x: torch.Tensor, meta: AttnMeta, kv: KVPool, layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim)
        k = self.k_proj(x).view(b, t, -1, self.head_dim)
        v = self.v_proj(x).view(b, t, -1, self.head_dim)
        q, k = self.rotary(q, k, meta.positions)
        kv.write(layer, meta, k, v)
        keys, values = kv.read(layer, meta)                     # [B, C, kvh, hd]
        groups = q.shape[2] // keys.shape[2]
        keys = keys.repeat_interleave(groups, dim=2).transpose(1, 2)
        values = values.repeat_interleave(groups, dim=2).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=meta.mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
