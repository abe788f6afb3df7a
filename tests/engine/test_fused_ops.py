"""The layer's fused elementwise ops: the torch forms on CPU (what the layers compute with or
without them), and the Triton kernels under Triton's interpreter against those forms."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness import run_under_triton_interpreter
from refengine.models import fused_ops
from refengine.models.configs import LlamaConfig
from refengine.models.layers import MLP, KVPool, causal_meta
from refengine.models.llama import DecoderLayer, Rotary


def test_the_fused_mlp_computes_the_unfused_swiglu_on_cpu():
    torch.manual_seed(0)
    mlp = MLP(16, 40)
    x = torch.randn(2, 3, 16)
    want = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    mlp.fuse()
    torch.testing.assert_close(mlp(x), want)


def test_a_decoder_layer_computes_add_then_norm_as_before():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    layer = DecoderLayer(cfg, Rotary(8, 10000.0, None)).eval()
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.normal_()
    kv = KVPool(1, 2, 16, 2, 8, torch.float32, "cpu")
    meta = causal_meta(torch.arange(2), torch.arange(3)[None].expand(2, 3) + 4, 16)
    residual, delta = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    with torch.no_grad():
        out, res = layer(delta, residual, meta, kv.k[0].clone(), kv.v[0].clone())
        # The unfused order: add, norm, attention, add, norm, MLP.
        r = residual + delta
        r = r + layer.self_attn(layer.input_layernorm(r), meta, kv.k[0].clone(), kv.v[0].clone())
        want_out = layer.mlp(layer.post_attention_layernorm(r))
    torch.testing.assert_close(res, r)
    torch.testing.assert_close(out, want_out)


def test_cpu_always_runs_the_torch_form_with_every_kernel_switched_on():
    x, d, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    old, fused_ops.ENABLED = fused_ops.ENABLED, set(fused_ops.KERNELS)
    try:
        with torch.no_grad():
            got, res = fused_ops.add_rms_norm(x, d, w, 1e-5)
    finally:
        fused_ops.ENABLED = old
    torch.testing.assert_close(res, x + d)
    torch.testing.assert_close(got, F.rms_norm(x + d, (8,), w, 1e-5))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernels_match_the_torch_forms_under_the_interpreter():
    script = textwrap.dedent("""
        import torch
        from refengine.models import triton_fused as k
        from refengine.models.fused_ops import add_rms_norm_reference, silu_mul_reference
        g = torch.Generator().manual_seed(1)
        # 3-d and 2-d inputs, a width that is no multiple of the block, and a row-strided view.
        for x in (torch.randn(2, 3, 2 * 1500, generator=g), torch.randn(5, 2 * 64, generator=g),
                  torch.randn(4, 2 * 3000, generator=g)[:, : 2 * 1100]):
            assert k.supports(x)
            got = k.silu_mul(x)
            assert got.shape == x.shape[:-1] + (x.shape[-1] // 2,)
            assert (got - silu_mul_reference(x)).abs().max() < 1e-5
        print("silu_mul ok")
        for shape in ((2, 3, 96), (5, 100)):          # a hidden size that is no power of two
            x, d = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
            w = torch.randn(shape[-1], generator=g)
            for delta in (d, None):
                out, res = k.add_rms_norm(x, delta, w, 1e-5)
                want_out, want_res = add_rms_norm_reference(x, delta, w, 1e-5)
                assert (out - want_out).abs().max() < 1e-4 and torch.equal(res, want_res)
                assert delta is not None or res is x     # no add: the residual is the input itself
        print("add_rms_norm ok")
    """)
    out = run_under_triton_interpreter(script)
    assert "silu_mul ok" in out and "add_rms_norm ok" in out


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_rope_store_matches_the_layers_torch_path_under_the_interpreter():
    """The kernel's q and pool writes against Attention's own torch path (rotation matrix, then
    index writes), on a chain and on tree-like slots, through rows that are not 0..B-1."""
    script = textwrap.dedent("""
        import torch
        from refengine.models import triton_fused as k
        from refengine.models.layers import Attention, Rotary, AttnMeta, fuse_projections
        torch.manual_seed(0)
        hd, hq, hk = 16, 4, 2
        rot = Rotary(hd, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        attn = Attention(32, 32, hq, hk, hd, rot)
        attn.fuse()
        b, t, c = 2, 3, 24
        rows = torch.tensor([2, 0])
        pos = torch.tensor([[5, 6, 7], [9, 10, 10]])             # the second row: two tree nodes at one depth
        slots = torch.tensor([[5, 6, 7], [9, 10, 11]])
        meta = AttnMeta(rows, pos, slots, torch.ones(b, t, c, dtype=torch.bool))
        x = torch.randn(b, t, 32)
        q_ref, kr, vr = attn._rotated_qkv(x, meta)
        kc, vc = torch.zeros(3, c, hk, hd), torch.zeros(3, c, hk, hd)
        kc2, vc2 = kc.clone(), vc.clone()
        r = rows[:, None].expand_as(slots)
        kc[r, slots], vc[r, slots] = kr, vr
        qkv = torch.nn.functional.linear(x, *attn.qkv).view(b, t, -1, hd)
        cos, sin = rot.cos_sin(pos, x.dtype)
        q = k.rope_store(qkv, hq, hk, cos, sin, kc2, vc2, rows, slots)
        assert (q - q_ref).abs().max() < 1e-5
        assert (kc2 - kc).abs().max() < 1e-5 and torch.equal(vc2, vc)
        print("rope_store ok")
    """)
    out = run_under_triton_interpreter(script)
    assert "rope_store ok" in out


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_a_whole_forward_with_every_kernel_on_matches_the_torch_forward_under_the_interpreter():
    """The layers' wiring: the tiny target with all three kernels switched on (run by the
    interpreter on CPU tensors, so the CUDA-only check is lifted here) computes the same hidden
    states, aux states and KV pool as with none."""
    script = textwrap.dedent("""
        import torch
        from refengine.models import fused_ops, triton_fused
        from refengine.models.layers import causal_meta, fuse_projections
        from refengine.presets import build_target
        fused_ops._kernel_for = lambda name, x: (triton_fused if name in fused_ops.ENABLED
                                                 and triton_fused.supports(x) else None)
        calls = dict.fromkeys(fused_ops.KERNELS, 0)
        for name in fused_ops.KERNELS:            # count what the layers actually launched
            def counted(*a, _f=getattr(triton_fused, name), _n=name, **kw):
                calls[_n] += 1
                return _f(*a, **kw)
            setattr(triton_fused, name, counted)
        model = fuse_projections(build_target("tiny", 0, "cpu").eval())
        b, t, c = 2, 3, 16
        ids = torch.randint(1, model.config.vocab_size, (b, t))
        meta = causal_meta(torch.tensor([1, 0]), torch.arange(t)[None].expand(b, t) + 4, c)
        runs = []
        for on in (set(), set(fused_ops.KERNELS)):
            fused_ops.ENABLED = on
            kv = model.make_kv(2, c, torch.float32, "cpu")
            meta.cache.clear()
            with torch.no_grad():
                hidden, aux = model(ids, meta, kv)
            runs.append((hidden, aux, torch.stack(kv.k), torch.stack(kv.v)))
        for a, b_ in zip(*runs):
            assert (a - b_).abs().max() < 1e-4, (a - b_).abs().max()
        n = model.config.num_hidden_layers
        assert calls == {"silu_mul": n, "add_rms_norm": 2 * n, "rope_store": n}, calls
        print("forward ok")
    """)
    out = run_under_triton_interpreter(script)
    assert "forward ok" in out


@pytest.mark.parametrize("value, want", [(None, "['add_rms_norm', 'rope_store', 'silu_mul']"),
                                         ("rope_store,silu_mul", "['rope_store', 'silu_mul']"),
                                         ("none", "[]")])
def test_the_environment_picks_the_kernels_for_a_whole_process(value, want):
    """Unset: all three (measured faster on an H200); named: those; none: the torch forms."""
    code = "from refengine.models import fused_ops; print(sorted(fused_ops.ENABLED))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    if value is not None:
        env["SPECDECODE_FUSED_KERNELS"] = value
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.strip() == want
