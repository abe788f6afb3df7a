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


@triton.jit
def _rope_store(QKV, Cos, Sin, Q, K, V, Rows, Slots, T, s_tok, s_head, s_qt, s_qh, s_cs,
                skr, sks, skh, svr, svs, svh, HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)    # request * T + token
    head = tl.program_id(1)                # q heads, then k heads, then v heads
    d = tl.arange(0, HALF)
    src = QKV + tok * s_tok + head * s_head
    x1 = tl.load(src + d)
    x2 = tl.load(src + HALF + d)
    if head < HQ + HK:
        # HF's q * cos + rotate_half(q) * sin, with cos and sin the same on both halves.
        c = tl.load(Cos + tok * s_cs + d).to(tl.float32)
        s = tl.load(Sin + tok * s_cs + d).to(tl.float32)
        y1 = x1.to(tl.float32) * c - x2.to(tl.float32) * s
        y2 = x2.to(tl.float32) * c + x1.to(tl.float32) * s
        if head < HQ:
            dst = Q + tok * s_qt + head * s_qh
            tl.store(dst + d, y1.to(Q.dtype.element_ty))
            tl.store(dst + HALF + d, y2.to(Q.dtype.element_ty))
        else:
            row = tl.load(Rows + tok // T)
            slot = tl.load(Slots + tok)
            dst = K + row * skr + slot * sks + (head - HQ) * skh
            tl.store(dst + d, y1.to(K.dtype.element_ty))
            tl.store(dst + HALF + d, y2.to(K.dtype.element_ty))
    else:
        row = tl.load(Rows + tok // T)
        slot = tl.load(Slots + tok)
        dst = V + row * svr + slot * svs + (head - HQ - HK) * svh
        tl.store(dst + d, x1)
        tl.store(dst + HALF + d, x2)


def rope_store(qkv: torch.Tensor, hq: int, hk: int, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """q rotated, [B, T, hq, D] (new, contiguous); k rotated and v written into the pool rows."""
    b, t, heads, hd = qkv.shape
    q = qkv.new_empty(b, t, hq, hd)
    cs, sn = cos.reshape(b * t, hd), sin.reshape(b * t, hd)
    sl = slots.reshape(b * t)
    _rope_store[(b * t, heads)](qkv, cs, sn, q, k_cache, v_cache, rows, sl, t, qkv.stride(1), qkv.stride(2),
                                q.stride(1), q.stride(2), cs.stride(0), k_cache.stride(0), k_cache.stride(1),
                                k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                                HQ=hq, HK=hk, HALF=hd // 2, num_warps=1)
    return q
