"""benchmarks/forward_breakdown.py: per-op time from torch.profiler's averages (pure logic on
profiler-shaped rows), and one real CPU profile of the tiny preset."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import forward_breakdown as fb  # noqa: E402


def _ev(key, dev_us, cpu_us, count):
    return SimpleNamespace(key=key, self_device_time_total=dev_us, self_cpu_time_total=cpu_us, count=count)


def test_ops_are_per_forward_and_only_those_with_time_of_their_own():
    events = [_ev("aten::mm", 900.0, 50.0, 30), _ev("aten::linear", 0.0, 40.0, 30),
              _ev("refengine::attend", 300.0, 20.0, 3), _ev("cuLaunchKernelEx", 60.0, 9.0, 6)]
    got = fb.by_op(events, forwards=3, device="cuda")
    # On CUDA a Triton kernel launched outside any op keeps its time under the launch call.
    assert got == {"aten::mm": {"us": 300.0, "calls": 10.0}, "refengine::attend": {"us": 100.0, "calls": 1.0},
                   "cuLaunchKernelEx": {"us": 20.0, "calls": 2.0}}
    # On CPU the ops' own CPU time counts instead, and nothing else.
    cpu = fb.by_op(events, forwards=3, device="cpu")
    assert cpu["aten::linear"]["us"] == pytest.approx(40.0 / 3) and "cuLaunchKernelEx" not in cpu


def test_a_cpu_profile_of_the_tiny_preset_names_the_attention_op_and_the_matmuls():
    import torch

    from refengine.models.layers import fuse_projections
    from refengine.presets import build_target

    model = fuse_projections(build_target("tiny", 0, "cpu").eval())
    with torch.no_grad():
        row = fb.breakdown(model, batch=2, t=2, ctx=16, device="cpu", dtype=torch.float32, forwards=2)
    layers = model.config.num_hidden_layers
    assert row["ops"]["refengine::attend"]["calls"] == layers
    assert "aten::mm" in row["ops"] or "aten::addmm" in row["ops"]
    assert row["ops_us_total"] == pytest.approx(sum(r["us"] for r in row["ops"].values()))
    assert fb.lines(row)[0].startswith("## batch 2 x T=2, context 16")


def test_an_unknown_variant_is_refused_in_one_line_before_any_model_is_built(capsys):
    assert fb.main(["--device", "cpu", "--variants", "base,fast"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "forward_breakdown: unknown variant(s) fast; known: base, torch, silu, norm, rope, skip, nolimit, all"


def test_a_wider_mask_is_a_graphs_context_bucket_around_the_same_rows():
    import torch

    from refengine.models.layers import fuse_projections
    from refengine.presets import build_target

    model = fuse_projections(build_target("tiny", 0, "cpu").eval())
    with torch.no_grad():
        row = fb.breakdown(model, batch=2, t=1, ctx=10, device="cpu", dtype=torch.float32, forwards=1, width=64)
    assert (row["ctx"], row["width"]) == (10, 64)
    assert "in a mask of 64" in fb.lines(row)[0]


def test_each_variant_is_checked_against_the_torch_forms_on_the_same_seeded_inputs(capsys, tmp_path):
    """On CPU every variant runs the torch forms, so the check must read exactly zero; a changed
    logit or K/V entry shows in the relative difference and the greedy agreement."""
    import json

    import torch

    out = tmp_path / "fb.json"
    assert fb.main(["--device", "cpu", "--model-path", "tiny", "--batch", "2", "--t", "2", "--ctx", "8",
                    "--variants", "base,torch", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["torch", "base"]          # the reference runs first
    assert rows[1]["vs_torch"] == {"logits_rel": 0.0, "kv_rel": 0.0, "argmax_agree": 1.0}
    assert "against the torch forms: logits max |diff| 0.00e+00" in capsys.readouterr().out

    ref = {"logits": torch.tensor([[[1.0, 3.0], [2.0, -4.0]]]), "kv": torch.ones(2, 1, 2)}
    got = {"logits": torch.tensor([[[1.0, 3.0], [2.0, 5.0]]]), "kv": torch.ones(2, 1, 2) * 1.5}
    c = fb.compare(got, ref)
    assert c["logits_rel"] == pytest.approx(9.0 / 4.0) and c["kv_rel"] == pytest.approx(0.5)
    assert c["argmax_agree"] == 0.5
