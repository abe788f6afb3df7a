"""The CUDA kernels behind refengine.models.fused_ops: float32 arithmetic, results rounded to the
input's dtype where the torch form rounds them. Imported only where Triton is present (fused_ops
guards it); must not hold state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SILU_BLOCK = 1024


def supports(x: torch.Tensor) -> bool:
    return x.dtype in _DTYPES and x.stride(-1) == 1 and x.numel() > 0


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[N, last] over every leading dimension: a view for the layer's outputs, a copy otherwise."""
    return x.reshape(-1, x.shape[-1])


@triton.jit
def _silu_mul(GU, Out, n, s_gu, s_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < n
    g = tl.load(GU + row * s_gu + cols, mask=valid, other=0.0).to(tl.float32)
    u = tl.load(GU + row * s_gu + n + cols, mask=valid, other=0.0).to(tl.float32)
    tl.store(Out + row * s_out + cols, (g * tl.sigmoid(g) * u).to(Out.dtype.element_ty), mask=valid)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    rows = _rows(gate_up)
    out = gate_up.new_empty(*gate_up.shape[:-1], n)
    flat = out.view(-1, n)
    _silu_mul[(rows.shape[0], triton.cdiv(n, SILU_BLOCK))](rows, flat, n, rows.stride(0), flat.stride(0),
                                                           BLOCK=SILU_BLOCK, num_warps=4)
    return out


@triton.jit
def _add_rms_norm(X, Delta, W, Out, Res, h, eps, s_x, s_d, s_o, s_r,
                  HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < h
    x = tl.load(X + row * s_x + cols, mask=valid, other=0.0)
    if HAS_DELTA:
        x = (x.to(tl.float32) + tl.load(Delta + row * s_d + cols, mask=valid, other=0.0).to(tl.float32))
        x = x.to(Res.dtype.element_ty)             # the residual as the unfused add stores it
        tl.store(Res + row * s_r + cols, x, mask=valid)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / h + eps)
    w = tl.load(W + cols, mask=valid, other=0.0).to(tl.float32)
    tl.store(Out + row * s_o + cols, (xf * inv * w).to(Out.dtype.element_ty), mask=valid)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = x.shape[-1]
    xr = _rows(x)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res = x if delta is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    dr = _rows(delta) if delta is not None else xr
    o2, r2 = out.view(-1, h), res.reshape(-1, h)
    block = triton.next_power_of_2(h)
    _add_rms_norm[(xr.shape[0],)](xr, dr, weight, o2, r2, h, eps, xr.stride(0), dr.stride(0), o2.stride(0),
                                  r2.stride(0), HAS_DELTA=delta is not None, BLOCK=block,
                                  num_warps=min(16, max(4, block // 512)))
    return out, res
