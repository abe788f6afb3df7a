"""Where a target forward's time goes inside one CUDA graph, side by side in one process: the
8B-shaped preset (TP1, bf16, random weights) replayed as a graph at 1 and 4 tokens, with the
attention op's CUDA kernel (Triton) and with its torch reference, next to the same graph with the
attention and every elementwise op left out (the matmul-only floor: weights streamed once). The
gap between the floor and the full forward is the per-layer kernel overhead that keeps the verify
phase above the weight-streaming cost proxy.

GPU (one H200, about 1 minute):
    python benchmarks/attention_variants.py
CPU check of the script (tiny preset, graphs replaced by plain calls):
    python benchmarks/attention_variants.py --device cpu --model-path tiny --reps 5
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


from cuda_timing import graph_us  # noqa: E402
from refengine.models import layers  # noqa: E402
from refengine.models.attend import attend, attend_reference  # noqa: E402
from refengine.models.layers import causal_meta, fuse_projections  # noqa: E402
from refengine.presets import build_target  # noqa: E402


def timed(fn, device: str, reps: int) -> float:
    """Median µs of `fn` replayed as a CUDA graph (or called, on CPU)."""
    return graph_us(fn, reps, device, skip=0)


def matmul_floor(model, x: torch.Tensor) -> torch.Tensor:
    """Every projection of every layer and the lm_head on `x`, nothing else."""
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        h = F.linear(x, *a.qkv) if a.qkv is not None else a.q_proj(x)
        x = a.o_proj(h[..., : a.o_proj.weight.shape[1]])
        gu = F.linear(x, *m.gate_up) if m.gate_up is not None else m.gate_proj(x)
        x = m.down_proj(gu[..., : m.down_proj.weight.shape[1]])
    return model.logits(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model-path", default="llama-3.1-8b")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = fuse_projections(build_target(a.model_path, 0, a.device).to(dtype).eval())
    kv = model.make_kv(2, a.ctx + 16, dtype, a.device)
    rows = torch.tensor([0], device=a.device)
    report: dict = {"model": a.model_path, "device": a.device, "ctx": a.ctx, "rows": []}
    print(f"# attention_variants: {a.model_path} {dtype} TP1 on {a.device}; context {a.ctx}; median of {a.reps} "
          f"{'graph replays' if a.device == 'cuda' else 'calls'} (µs)")
    print("   tokens   floor (matmuls only)   " + "   ".join(f"{v:>9}" for v in ("triton", "torch")) + "   triton/floor")
    with torch.no_grad():
        for t in (1, 4):
            ids = torch.randint(0, model.config.vocab_size, (1, t), device=a.device)
            pos = torch.arange(t, device=a.device)[None] + a.ctx - t - 1
            meta = causal_meta(rows, pos, a.ctx)
            x = torch.randn(1, t, model.config.hidden_size, device=a.device, dtype=dtype)
            floor = timed(lambda: matmul_floor(model, x), a.device, a.reps)
            res, logits = {}, {}
            for impl, op in (("triton", attend), ("torch", attend_reference)):
                layers.attend = op           # what Attention.forward calls
                try:
                    logits[impl] = model.logits(model(ids, meta, kv)[0]).float()
                    res[impl] = timed(lambda: model.logits(model(ids, meta, kv)[0]), a.device, a.reps)
                except Exception as e:  # one variant may not capture: say so and go on
                    res[impl] = float("nan")
                    print(f"   {impl}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            layers.attend = attend
            if len(logits) == 2:   # the same function: the two must agree to rounding
                diff = (logits["triton"] - logits["torch"]).abs().max().item()
                print(f"   (tokens {t}: max |logit difference| triton vs torch {diff:.3g})")
            report["rows"].append({"tokens": t, "floor_us": floor, **{f"{k}_us": v for k, v in res.items()}})
            print(f"   {t:>6}   {floor:20.1f}   {res['triton']:9.1f}   {res['torch']:9.1f}   {res['triton'] / floor:12.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
