"""The layer's small elementwise ops as one kernel each, where SGLang runs its fused kernels:
SwiGLU's activation (`silu_mul`: silu(gate) * up on the joined gate/up output), the residual add
with the RMSNorm after it (`add_rms_norm`), and RoPE on q and k with the KV pool write
(`rope_store`).

Why: eager torch runs each as two or more launch-bound kernels, 32 layers deep. On an H200 at 64
rows × 4 tokens SiLU·mul alone took 757 µs of a 10.2-ms verify, and at batch 1 the norms and adds
458 µs and RoPE with the KV writes 288 µs of a 5.7-ms forward
(benchmarks/results/forward_breakdown_h200.md). Implementations: the torch
form (any device, the CPU path, autograd, and what torch.compile traces: Inductor fuses these
itself), and Triton kernels on CUDA (refengine.models.triton_fused).

The kernels run only where `ENABLED` names them: all three by default, since an H200 run measured
them in the engine's own forward (benchmarks/results/fused_kernels_h200.md: a batch-64 verify
11–14 % faster, a batch-1 forward 16–19 %). `SPECDECODE_FUSED_KERNELS` (names, comma-separated, `all` or
`none`) picks them for a whole engine, ranks included, so a benchmark can run the engine with and
without them side by side. Off CUDA, under torch.compile or with autograd the torch form runs.
Must not know about requests, graphs or TP.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from refengine.config import FUSED_KERNELS as KERNELS
from refengine.config import FUSED_KERNELS_ENV, fused_kernels_from

ENABLED: set[str] = fused_kernels_from(os.environ.get(FUSED_KERNELS_ENV))
_TRITON: object | None = None     # refengine.models.triton_fused once it imported, False if it cannot


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + delta), x + delta); the sum rounded to x's dtype before the norm, as the
    unfused layer computes it."""
    r = x if delta is None else x + delta
    return F.rms_norm(r, weight.shape, weight, eps), r


def triton_kernels():
    """refengine.models.triton_fused, or None where Triton cannot be imported."""
    global _TRITON
    if _TRITON is None:
        try:
            from refengine.models import triton_fused
            _TRITON = triton_fused
        except Exception:  # no Triton (CPU builds of torch): the torch forms run instead
            _TRITON = False
    return _TRITON or None


def _kernel_for(name: str, x: torch.Tensor):
    """The Triton kernels' module when kernel `name` is switched on and may run on `x`, else None."""
    if name not in ENABLED or not x.is_cuda or torch.compiler.is_compiling() or torch.is_grad_enabled():
        return None
    k = triton_kernels()
    return k if k is not None and k.supports(x) else None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    k = _kernel_for("silu_mul", gate_up)
    return k.silu_mul(gate_up) if k is not None else silu_mul_reference(gate_up)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    k = _kernel_for("add_rms_norm", x)
    if k is not None and (delta is None or k.supports(delta)) and weight.is_contiguous():
        return k.add_rms_norm(x, delta, weight, eps)
    return add_rms_norm_reference(x, delta, weight, eps)


def rope_store_kernel(x: torch.Tensor, head_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """The kernels' module when RoPE with the K/V write may run as one kernel for a layer's input x
    (asked before the projection, so a refusal costs nothing), else None: the caller then takes its
    torch path, which computes the same (Attention._rotated_qkv and the pool writes). The kernel's
    `rope_store(qkv [B, T, hq + 2 hk, D] contiguous, hq, hk, cos, sin [B, T, 1, D], k_cache,
    v_cache, rows [B], slots [B, T])` returns q rotated and writes k and v into the pool."""
    k = _kernel_for("rope_store", x)
    if (k is None or head_dim & (head_dim - 1) or k_cache.dtype != x.dtype
            or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1):
        return None
    return k
