"""SwiGLU's activation on the joined gate/up output: the torch form on CPU, and the Triton kernel
under Triton's interpreter against it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from refengine.models import silu_mul as sm
from refengine.models.layers import MLP

ROOT = Path(__file__).resolve().parents[2]


def test_the_fused_mlp_computes_the_unfused_swiglu_on_cpu():
    torch.manual_seed(0)
    mlp = MLP(16, 40)
    x = torch.randn(2, 3, 16)
    want = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    mlp.fuse()
    torch.testing.assert_close(mlp(x), want)
    # On CPU the torch form runs even when the fused kernel is switched on.
    old, sm.FUSED = sm.FUSED, True
    try:
        with torch.no_grad():
            torch.testing.assert_close(mlp(x), want)
    finally:
        sm.FUSED = old


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernel_matches_the_torch_form_under_the_interpreter():
    script = textwrap.dedent("""
        import torch
        from refengine.models import triton_silu_mul as k
        from refengine.models.silu_mul import silu_mul_reference
        g = torch.Generator().manual_seed(1)
        # 3-d and 2-d inputs, a width that is no multiple of the block, and a row-strided view.
        cases = [torch.randn(2, 3, 2 * 1500, generator=g), torch.randn(5, 2 * 64, generator=g),
                 torch.randn(4, 2 * 3000, generator=g)[:, : 2 * 1100]]
        for x in cases:
            assert k.supports(x)
            got = k.silu_mul(x)
            assert got.shape == x.shape[:-1] + (x.shape[-1] // 2,)
            assert (got - silu_mul_reference(x)).abs().max() < 1e-5
        print("ok", len(cases))
    """)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ok 3" in r.stdout
