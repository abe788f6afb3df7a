"""Where a target forward's GPU time goes, by the op that launched it: the engine's own layers
(the 8B-shaped preset, TP1, fused projections, the attention op of the device) on `--batch` rows
× T tokens over a KV pool of `--ctx` positions, under torch.profiler, next to the same forward
replayed as one CUDA graph and the matmuls alone (attention_variants.matmul_floor), in one run.

Why: at batch 64 the engine's verify pays about 2 ms per forward above the matmuls and the KV
floor, the same at every T (results/batch_cost_h200.md). That fixed part is what keeps deep chains
looking cheap at high load. This script says which ops it is made of (the norms, RoPE, the KV
write, attention, the adds, SiLU·mul), so the next kernel to fuse is chosen by figures.

Per op: GPU µs per forward (self device time of the aten op or custom op, summed over its
kernels) and calls per forward. The profiled forward runs eagerly, so its kernels are the
graph's kernels; the graph replay's time is printed beside their sum (the difference is the gaps
between kernels inside the graph).

GPU (one H200, about 1 minute):
    python benchmarks/forward_breakdown.py --json OUT.json
Each fused kernel and the attention skip against the torch forms, rows of 320 in a graph's context
bucket of 472, every variant's first forward checked against the torch forms' on the same seeded
inputs (about 2 minutes):
    python benchmarks/forward_breakdown.py --width 472 --variants torch,base,silu,norm,rope,skip,nolimit,all --json OUT.json
CPU check of the script (tiny preset, no graphs):
    python benchmarks/forward_breakdown.py --device cpu --model-path tiny --batch 4 --t 1,2 --ctx 64

Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

import torch  # noqa: E402

from attention_variants import matmul_floor  # noqa: E402
from cuda_timing import graph_us  # noqa: E402


# variant: the fused_ops kernels it switches on, whether attention skips hidden columns, and whether
# it stops at the visible limit; None for any: as the engine runs by default (fused_ops.ENABLED,
# triton_attend.SKIP_HIDDEN, attend.USE_LIMIT at import)
VARIANTS = {"base": (None, None, None), "torch": (set(), False, None), "silu": ({"silu_mul"}, False, None),
            "norm": ({"add_rms_norm"}, False, None), "rope": ({"rope_store"}, False, None),
            "skip": (None, True, None), "nolimit": (None, None, False),
            "all": ({"silu_mul", "add_rms_norm", "rope_store"}, True, None)}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def by_op(events, forwards: int, device: str) -> dict[str, dict]:
    """{op name: {"us": self time per forward (device time on CUDA, CPU time on CPU), "calls": calls
    per forward}} from torch.profiler's key_averages; ops with no time of their own are left out.
    On CUDA every key with device time counts: a Triton kernel launched outside any op (the
    fused_ops kernels) carries its time under the launch call's name (cuLaunchKernel…). On CPU
    only the ops count (the profiler's other CPU rows are Python and bookkeeping)."""
    out: dict[str, dict] = defaultdict(lambda: {"us": 0.0, "calls": 0.0})
    for e in events:
        us = e.self_device_time_total if device == "cuda" else e.self_cpu_time_total
        if us <= 0 or (device != "cuda" and not e.key.startswith(("aten::", "refengine::"))):
            continue
        row = out[e.key]
        row["us"] += us / forwards
        row["calls"] += e.count / forwards
    return dict(out)


def breakdown(model, batch: int, t: int, ctx: int, device: str, dtype, forwards: int = 5, width: int = 0,
              outputs: dict | None = None) -> dict:
    """One shape's profile; `width` is the mask's (a graph's context bucket, > ctx + t), default
    just the rows' own length. The inputs and the KV pool's past are seeded, the same for every
    call with the same shape; `outputs`, when given, receives the first forward's logits and the
    K/V it wrote (for compare())."""
    from torch.profiler import ProfilerActivity, profile

    from refengine.models.layers import causal_meta

    width = max(width, ctx + t + 1)
    gen = torch.Generator(device=device).manual_seed(batch * 1000 + t)
    kv = model.make_kv(batch, width, dtype, device)
    for pool in kv.k + kv.v:       # a past to attend to, not zeros, so attention's result is checked too
        pool.normal_(generator=gen)
    rows = torch.arange(batch, device=device)
    pos = (torch.arange(t, device=device) + ctx)[None].expand(batch, t).contiguous()
    meta = causal_meta(rows, pos, width)
    ids = torch.randint(1, model.config.vocab_size, (batch, t), device=device, generator=gen)
    x = torch.randn(batch, t, model.config.hidden_size, device=device, dtype=dtype, generator=gen)

    def fwd():
        meta.cache.clear()
        return model.logits(model(ids, meta, kv)[0])

    if outputs is not None:
        outputs["logits"] = fwd().float()
        outputs["kv"] = torch.stack([p[:, ctx:ctx + t] for p in kv.k + kv.v]).float()
    graph = graph_us(fwd, 30 if device == "cuda" else 3, device)
    matmuls = graph_us(lambda: matmul_floor(model, x), 30 if device == "cuda" else 3, device)
    for _ in range(2):
        fwd()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(forwards):
            fwd()
        if device == "cuda":
            torch.cuda.synchronize()
    ops = by_op(prof.key_averages(), forwards, device)
    del kv
    return {"batch": batch, "t": t, "ctx": ctx, "width": width, "graph_us": graph, "matmuls_us": matmuls,
            "ops_us_total": sum(r["us"] for r in ops.values()), "ops": ops}


def compare(got: dict, ref: dict) -> dict:
    """A variant's first forward against the torch forms' on the same inputs: the largest logit and
    written-K/V difference relative to the reference's largest magnitude, and the share of rows whose
    greedy token agrees (bf16 rounding moves near ties, nothing else should)."""
    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    same = (got["logits"].argmax(-1) == ref["logits"].argmax(-1)).float().mean()
    return {"logits_rel": rel(got["logits"], ref["logits"]), "kv_rel": rel(got["kv"], ref["kv"]),
            "argmax_agree": float(same)}


def lines(row: dict, top: int = 14) -> list[str]:
    variant = f" [{row['variant']}]" if row.get("variant") else ""
    out = [f"## batch {row['batch']} x T={row['t']}, context {row['ctx']} in a mask of {row.get('width', row['ctx'])}"
           f"{variant}: graph replay {row['graph_us']:.0f} µs, "
           f"matmuls alone {row['matmuls_us']:.0f} µs, ops' own time {row['ops_us_total']:.0f} µs",
           "   op                                        µs/forward   share   calls/forward"]
    ops = sorted(row["ops"].items(), key=lambda kv: -kv[1]["us"])
    for name, r in ops[:top]:
        out.append(f"   {name[:42]:42}  {r['us']:10.1f}  {100 * r['us'] / row['ops_us_total']:5.1f} %  "
                   f"{r['calls']:8.1f}")
    rest = ops[top:]
    if rest:
        out.append(f"   ({len(rest)} more ops)                               "
                   f"{sum(r['us'] for _, r in rest):10.1f}")
    if row.get("vs_torch"):
        c = row["vs_torch"]
        out.append(f"   against the torch forms: logits max |diff| {c['logits_rel']:.2e}, written K/V "
                   f"{c['kv_rel']:.2e} (relative to the largest magnitude); greedy token agrees in "
                   f"{100 * c['argmax_agree']:.1f} % of rows")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model-path", default="llama-3.1-8b", help="a target preset")
    ap.add_argument("--batch", type=_ints, default=_ints("64,1"), help="rows, comma-separated")
    ap.add_argument("--t", type=_ints, default=_ints("1,4"), help="tokens per row, comma-separated")
    ap.add_argument("--ctx", type=int, default=320, help="KV positions already in each row")
    ap.add_argument("--width", type=int, default=0, help="mask width (a graph's context bucket); default ctx + T + 1")
    ap.add_argument("--variants", default="base", help="comma-separated: base (as the engine runs), torch "
                    "(no fused kernel: the torch forms; every other variant is checked against it), silu "
                    "(only the fused SiLU·mul kernel), norm (only the fused add + RMSNorm), rope (only RoPE "
                    "with the KV write), skip (as the engine runs, attention skipping hidden columns), nolimit "
                    "(as the engine runs, attention reading the whole context bucket), all "
                    "(the three kernels and the skip)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        print(f"forward_breakdown: unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}",
              file=sys.stderr)
        return 2
    from refengine.models.layers import fuse_projections
    from refengine.presets import build_target

    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = fuse_projections(build_target(a.model_path, 0, a.device).to(dtype).eval())
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print(f"# forward_breakdown: {a.model_path} {dtype} on {gpu}; torch {torch.__version__}", flush=True)
    report = {"model": a.model_path, "device": gpu, "dtype": str(dtype), "rows": []}
    from refengine.models import fused_ops
    from refengine.models.attend import triton_kernel
    ta = triton_kernel()
    from refengine.models import attend as attend_mod
    default = (set(fused_ops.ENABLED), ta.SKIP_HIDDEN if ta is not None else False, attend_mod.USE_LIMIT)
    # The torch forms run first for each shape, so every other variant is checked against them.
    variants.sort(key=lambda v: v != "torch")
    with torch.no_grad():
        for b, t in ((b, t) for b in a.batch for t in a.t):
            ref: dict | None = None
            for v in variants:
                kernels, skip, limit = VARIANTS[v]
                fused_ops.ENABLED = set(default[0] if kernels is None else kernels)
                if ta is not None:
                    ta.SKIP_HIDDEN = default[1] if skip is None else skip
                attend_mod.USE_LIMIT = default[2] if limit is None else limit
                outputs: dict = {}
                try:
                    row = breakdown(model, b, t, a.ctx, a.device, dtype, width=a.width, outputs=outputs)
                finally:
                    fused_ops.ENABLED = set(default[0])
                    if ta is not None:
                        ta.SKIP_HIDDEN = default[1]
                    attend_mod.USE_LIMIT = default[2]
                row["variant"] = v
                if v == "torch":
                    ref = outputs
                elif ref is not None:
                    row["vs_torch"] = compare(outputs, ref)
                report["rows"].append(row)
                print("\n".join(lines(row)), flush=True)
                if a.json:
                    Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
