"""The CUDA kernel behind refengine.models.silu_mul: silu(gate) * up in one pass over the joined
gate/up projection output, float32 arithmetic, one program per (row, block of columns).
Imported only where Triton is present (silu_mul.py guards it); must not hold state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _silu_mul(GU, Out, n, s_gu, s_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < n
    g = tl.load(GU + row * s_gu + cols, mask=valid, other=0.0).to(tl.float32)
    u = tl.load(GU + row * s_gu + n + cols, mask=valid, other=0.0).to(tl.float32)
    tl.store(Out + row * s_out + cols, (g * tl.sigmoid(g) * u).to(Out.dtype.element_ty), mask=valid)


def supports(gate_up: torch.Tensor) -> bool:
    return (gate_up.dtype in (torch.bfloat16, torch.float16, torch.float32) and gate_up.shape[-1] % 2 == 0
            and gate_up.stride(-1) == 1 and gate_up.numel() > 0)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * n)          # a view for the projection outputs the MLP passes
    out = gate_up.new_empty(*gate_up.shape[:-1], n)
    flat = out.view(-1, n)
    _silu_mul[(rows.shape[0], triton.cdiv(n, BLOCK))](rows, flat, n, rows.stride(0), flat.stride(0),
                                                      BLOCK=BLOCK, num_warps=4)
    return out
