"""Attention over the KV pool as one custom op, `refengine::attend`: the GQA attention of every
forward (target layers and draft head), prefill, verify, trees and padded graph rows alike.

    out = attend(q [B, T, Hq, D], k_cache [R, S, Hkv, D], v_cache, rows [B], mask [B, T, C], scale,
                 limit [B] or None)

Query row b attends to slots 0..C-1 of KV-pool row rows[b] where mask[b, t, c] is true (every query
sees at least its own slot, so no row is empty). `limit` (visible_limit(mask), once per forward)
promises that no query of request b sees a column at or past limit[b]: the kernel then reads only
the live part of a graph's context bucket, as FlashInfer reads a request's seq_len and no more (the
torch form reads the mask whole). The output is a new contiguous tensor. Why an op and not torch
code in the layer:
  * one implementation per device behind one name: the torch reference below (any device, and
    the CPU path), and a Triton kernel on CUDA (refengine.models.triton_attend) that reads the
    pool rows in place — the torch form gathers K/V rows, then runs ~8 kernels per layer;
  * torch.compile sees one opaque node with a fake implementation, so the layers around it
    compile with fullgraph=True and Inductor fuses what it can on either side.
Must not know about requests, graphs or TP (heads are whatever the sharded weights leave).
"""

from __future__ import annotations

from typing import Optional

import torch

_TRITON: object | None = None     # refengine.models.triton_attend once it imported, False if it cannot


# The layers pass visible_limit(mask) to the op; False makes them pass None (the kernel then reads
# the whole context bucket): a switch for benchmarks/forward_breakdown.py's side-by-side variant.
USE_LIMIT = True


def visible_limit(mask: torch.Tensor) -> torch.Tensor:
    """[B] int32: one past the last column any query of request b sees (mask [B, T, C])."""
    cols = torch.arange(1, mask.shape[-1] + 1, device=mask.device, dtype=torch.int32)
    return (mask.any(1) * cols).amax(-1)


def attend_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
                     mask: torch.Tensor, scale: float) -> torch.Tensor:
    """The torch form (and the check for every kernel): two matmuls over query heads grouped by
    their KV head, no repeat of K/V; softmax accumulates in float32 for half types."""
    b, t, hq, hd = q.shape
    c = mask.shape[-1]
    keys, values = k_cache[rows, :c], v_cache[rows, :c]               # [B, C, Hkv, D]
    hk = keys.shape[2]
    g = hq // hk
    qg = q.reshape(b, t, hk, g, hd).permute(0, 2, 3, 1, 4).reshape(b, hk, g * t, hd)
    scores = torch.matmul(qg, keys.permute(0, 2, 3, 1)).view(b, hk, g, t, c)
    bias = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device)
    bias.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    scores = torch.add(bias[:, None, None], scores, alpha=scale)
    probs = torch.softmax(scores, dim=-1).view(b, hk, g * t, c)
    out = torch.matmul(probs, values.permute(0, 2, 1, 3))            # [B, Hkv, g*T, D]
    return out.view(b, hk, g, t, hd).permute(0, 3, 1, 2, 4).contiguous().view(b, t, hq, hd)


@torch.library.custom_op("refengine::attend", mutates_args=())
def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
           mask: torch.Tensor, scale: float, limit: Optional[torch.Tensor] = None) -> torch.Tensor:
    return attend_reference(q, k_cache, v_cache, rows, mask, scale)


@attend.register_fake
def _(q, k_cache, v_cache, rows, mask, scale, limit=None):
    return q.new_empty(q.shape)            # contiguous, as both implementations return it


@attend.register_kernel("cuda")
def _(q, k_cache, v_cache, rows, mask, scale, limit=None):
    kernel = triton_kernel()
    if kernel is None or not kernel.supports(q, k_cache):
        return attend_reference(q, k_cache, v_cache, rows, mask, scale)
    return kernel.attend(q, k_cache, v_cache, rows, mask, scale, limit=limit)


def triton_kernel():
    """refengine.models.triton_attend, or None where Triton cannot be imported (reported by
    `attention_backend`)."""
    global _TRITON
    if _TRITON is None:
        try:
            from refengine.models import triton_attend
            _TRITON = triton_attend
        except Exception:  # no Triton (CPU builds of torch): the reference runs instead
            _TRITON = False
    return _TRITON or None


def attention_backend(device: torch.device | str, head_dim: int, dtype: torch.dtype) -> str:
    """What `attend` runs for this device and shape: "triton" or "torch" (for stats and logs)."""
    if not str(device).startswith("cuda"):
        return "torch"
    kernel = triton_kernel()
    return "triton" if kernel is not None and kernel.supports_shape(head_dim, dtype) else "torch"
