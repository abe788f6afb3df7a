"""SwiGLU's activation, silu(gate) * up, on one joined gate/up projection output [..., 2I] -> [..., I].

Why a module: eager torch runs it as two kernels over strided halves of the joined output (silu,
then the product), reading and writing every element twice. At 64 rows × 4 tokens on an H200 that
took 757 µs of a 10.2-ms verify (benchmarks/results/forward_breakdown_h200.md); one kernel reads
gate and up once and writes the product once. Implementations: the torch form (any device, the
CPU path, and what torch.compile traces: Inductor fuses it itself), and a Triton kernel on CUDA
(refengine.models.triton_silu_mul).

The Triton kernel runs only where `FUSED` is true. It stays false until an H200 run of
benchmarks/forward_breakdown.py --variants measures it against the torch form in the engine's own
forward. Must not know about requests, graphs or TP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FUSED = False
_TRITON: object | None = None     # refengine.models.triton_silu_mul once it imported, False if it cannot


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def triton_kernel():
    """refengine.models.triton_silu_mul, or None where Triton cannot be imported."""
    global _TRITON
    if _TRITON is None:
        try:
            from refengine.models import triton_silu_mul
            _TRITON = triton_silu_mul
        except Exception:  # no Triton (CPU builds of torch): the torch form runs instead
            _TRITON = False
    return _TRITON or None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if FUSED and gate_up.is_cuda and not torch.compiler.is_compiling() and not torch.is_grad_enabled():
        kernel = triton_kernel()
        if kernel is not None and kernel.supports(gate_up):
            return kernel.silu_mul(gate_up)
    return silu_mul_reference(gate_up)
