"""Building blocks shared by the Llama target and the EAGLE-3 head: RMSNorm, RoPE (with Llama-3
scaling), GQA attention over a preallocated KV pool, SwiGLU MLP.

Plain modules with no tensor parallelism inside: head counts are read from weight shapes at run
time, so refengine.tp can shard the projections after construction without touching this file.
Every forward takes fixed-shape inputs plus masks (no Python loop over tokens), so the GPU path can
capture CUDA graphs over them.

Kernel count is the cost that matters at decode shapes (batch 1, a few tokens: every matmul is a
weight stream and every elementwise op a few-µs launch, even inside a CUDA graph). `fuse_projections`
joins q/k/v and gate/up into one matmul each (the separate weights become views of the joined one, so
names, loading and TP are unchanged and no memory is added); attention is one op
(refengine.models.attend: a Triton kernel on CUDA); eagerly, RoPE is one batched matmul per layer
rotating q and k together (rotation matrix cached on the AttnMeta once per forward). Under
torch.compile (refengine.compiled) the traced path is plain elementwise RoPE and no cache, so Inductor
fuses it with the KV write, and a layer passes the residual stream on as (delta, residual) so the add
joins the next norm's kernel. Nothing here may graph-break under torch.compile (tests check it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from refengine.models import attend as attend_mod
from refengine.models import fused_ops
from refengine.models.attend import attend, attend_reference, visible_limit


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
        qkv = None
        if _fused(self.qkv, self.q_proj):
            hq, hk = self.q_proj.weight.shape[0] // hd, self.k_proj.weight.shape[0] // hd
            qkv = F.linear(x, *self.qkv).view(b, t, -1, hd)
            q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
        else:
            q, k = self.q_proj(x).view(b, t, -1, hd), self.k_proj(x).view(b, t, -1, hd)
            v = self.v_proj(x).view(b, t, -1, hd)
        if torch.compiler.is_compiling():
            # Inductor fuses cos/sin, the rotation of q and k and the KV write into one kernel.
            cos, sin = self.rotary.cos_sin(meta.positions, x.dtype)
            return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v
        # Eager: one batched matmul rotates q and k together (rotation matrix built once per forward).
        rope = self.rotary.matrix(meta, x.dtype)                # [B, T, hd, hd]
        if qkv is not None:
            qk = torch.matmul(qkv[:, :, :q.shape[2] + k.shape[2]], rope)
            return qk[:, :, :q.shape[2]], qk[:, :, q.shape[2]:], v
        return torch.matmul(q, rope), torch.matmul(k, rope), v

    def _fused_rope_store(self, x: torch.Tensor, meta: AttnMeta, k_cache: torch.Tensor,
                          v_cache: torch.Tensor) -> torch.Tensor | None:
        """q rotated, with k and v already in the pool, from one kernel (fused_ops.rope_store_kernel);
        None where that kernel does not run."""
        hd = self.head_dim
        kernel = fused_ops.rope_store_kernel(x, hd, k_cache, v_cache) if _fused(self.qkv, self.q_proj) else None
        if kernel is None:
            return None
        b, t, _ = x.shape
        hq, hk = self.q_proj.weight.shape[0] // hd, self.k_proj.weight.shape[0] // hd
        key = ("cos_sin", id(self.rotary), x.dtype)
        if key not in meta.cache:                    # once per forward, shared by every layer
            meta.cache[key] = self.rotary.cos_sin(meta.positions, x.dtype)
        cos, sin = meta.cache[key]
        qkv = F.linear(x, *self.qkv).view(b, t, -1, hd)     # contiguous: what the kernel indexes
        return kernel.rope_store(qkv, hq, hk, cos, sin, k_cache, v_cache, meta.rows, meta.slots)

    def forward(self, x: torch.Tensor, meta: AttnMeta, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """x [B, T, in_dim]; writes this forward's K/V into the pool tensors of this layer
        (k_cache, v_cache: [rows, row_len, kv_heads, head_dim]) and attends over them."""
        b, t, _ = x.shape
        q = self._fused_rope_store(x, meta, k_cache, v_cache)
        if q is None:
            q, k, v = self._rotated_qkv(x, meta)
            r = meta.rows[:, None].expand_as(meta.slots)
            k_cache[r, meta.slots] = k
            v_cache[r, meta.slots] = v
        # The op is inference-only (no autograd formula); training differentiates the torch form.
        if torch.is_grad_enabled():
            out = attend_reference(q, k_cache, v_cache, meta.rows, meta.mask, self.head_dim ** -0.5)
        else:
            out = attend(q, k_cache, v_cache, meta.rows, meta.mask, self.head_dim ** -0.5, _limit(meta, q))
        return self.o_proj(out.reshape(b, t, -1))


def _limit(meta: AttnMeta, q: torch.Tensor) -> torch.Tensor | None:
    """The mask's visible limit, once per forward and shared by every layer; None off CUDA (the
    torch form reads the mask whole) or when attend.USE_LIMIT is off."""
    if not (q.is_cuda and attend_mod.USE_LIMIT):
        return None
    if "limit" not in meta.cache:
        meta.cache["limit"] = visible_limit(meta.mask)
    return meta.cache["limit"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _fused(joined: tuple | None, first: nn.Linear) -> bool:
    """The joined weight is still what the Linears read (.to() or TP re-creates them). Compiled
    code skips the check (data_ptr is not traceable; engines fuse after moving weights)."""
    return joined is not None and (torch.compiler.is_compiling() or joined[0].data_ptr() == first.weight.data_ptr())


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
        if _fused(self.gate_up, self.gate_proj):
            return self.down_proj(fused_ops.silu_mul(F.linear(x, *self.gate_up)))
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
