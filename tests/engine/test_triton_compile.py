"""Every Triton kernel of the engine compiles for Hopper (sm_90, the H200s the GPU figures come
from) at the constants the engine launches it with, on a host without a GPU: Triton's own compiler
down to a cubin, so a kernel that only the interpreter accepts (types, scalar branches, shared
memory) fails here rather than on the first GPU call."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

I32, BF16 = "i32", "*bf16"


@pytest.fixture(autouse=True)
def _fp_fusion(monkeypatch):
    # Triton 3.9 warns when this is unset; 1 keeps its default, what a GPU launch compiles with.
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")


def _compile(fn, signature: dict[str, str], constants: dict[str, object]):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        src = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constants, "constexpr")}, constexprs=constants)
    except TypeError as e:   # a Triton whose AST-source API differs (the project pins triton>=3.4)
        pytest.skip(f"this Triton's ASTSource differs: {e}")
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    assert kernel.asm.get("cubin"), "no cubin"
    return kernel


def _attend_signature() -> dict[str, str]:
    sig = {"Q": BF16, "K": BF16, "V": BF16, "Rows": "*i64", "Mask": "*u8", "Limit": "*i32", "Out": BF16,
           "Part": "*fp32", "PartML": "*fp32"}
    sig.update(dict.fromkeys(("sqb", "sqt", "sqh", "skr", "sks", "skh", "svr", "svs", "svh", "smb", "smt", "sob",
                              "sot", "soh", "T", "C", "MB"), I32))
    return {**sig, "scale": "fp32"}


@pytest.mark.parametrize("skip,limit", [(False, True), (False, False), (True, False)])
@pytest.mark.parametrize("block_n,splits", [(32, 1), (64, 6)])   # plan() at 64 rows, and at batch 1
def test_the_attention_kernel_compiles_for_hopper(skip, limit, block_n, splits):
    from refengine.models import triton_attend as ta

    k = _compile(ta._attend_part, _attend_signature(),
                 {"G": 4, "HKV": 8, "D": 128, "BLOCK_M": 16, "BLOCK_N": block_n, "SPLITS": splits,
                  "IEEE": False, "SKIP": skip, "LIMIT": limit})
    assert k.metadata.shared <= 228 * 1024          # an H100/H200 SM's shared memory


def test_the_fused_elementwise_kernels_compile_for_hopper():
    from refengine.models import triton_fused as tf

    _compile(tf._silu_mul, {"GU": BF16, "Out": BF16, "n": I32, "s_gu": I32, "s_out": I32}, {"BLOCK": tf.SILU_BLOCK})
    norm = {"X": BF16, "Delta": BF16, "W": BF16, "Out": BF16, "Res": BF16, "h": I32, "eps": "fp32",
            "s_x": I32, "s_d": I32, "s_o": I32, "s_r": I32}
    for has_delta in (True, False):
        _compile(tf._add_rms_norm, norm, {"HAS_DELTA": has_delta, "BLOCK": 4096})
    rope = {"QKV": BF16, "Cos": BF16, "Sin": BF16, "Q": BF16, "K": BF16, "V": BF16, "Rows": "*i64",
            "Slots": "*i64", "T": I32}
    rope.update(dict.fromkeys(("s_tok", "s_head", "s_qt", "s_qh", "s_cs", "skr", "sks", "skh", "svr", "svs",
                               "svh"), I32))
    _compile(tf._rope_store, rope, {"HQ": 32, "HK": 8, "HALF": 64})
