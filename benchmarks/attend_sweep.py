"""The attention kernel's launch choices, measured: `refengine::attend`'s Triton kernel at the 8B's
head shapes for several (batch, tokens per row, context) shapes, under every combination of
context block, context splits, warps and whether hidden columns are read, each next to the kernel as plan() launches it and next to
the KV floor (the rows' K and V bytes over the copy bandwidth), in one run.

Shapes may say how many columns each row sees (`BxTxC:L`): a graph's mask is as wide as its
context bucket, so rows of length L < C leave C - L hidden columns, which the kernel reads unless
launched with skip_hidden.

Why: at batch 64 the engine's attention takes 1.37 ms of a 7.0 ms verify, about twice its KV
floor, while at batch 1 it is near the floor (results/forward_breakdown_h200.md). plan() was
chosen for batch-1 decode (split the context until the SMs are covered twice); this says what
a large batch wants instead, before plan() changes.

Every alternative's output is checked against plan()'s (max |difference|, printed): a faster
launch that computes something else is flagged, not ranked.

GPU (one H200, about 1 minute):
    python benchmarks/attend_sweep.py --json OUT.json
CPU check of the script (Triton's interpreter on CPU tensors; slow, tiny shapes):
    TRITON_INTERPRET=1 python benchmarks/attend_sweep.py --device cpu --shapes 2x1x40 --block-n 32 \\
        --splits 1,2 --warps 4

Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

import torch  # noqa: E402

from cuda_timing import graph_us  # noqa: E402

HQ, HKV, D = 32, 8, 128        # Llama-3.1-8B's attention heads, KV heads and head size


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _shapes(text: str) -> list[tuple[int, int, int, int]]:
    """`BxTxC[:L],...`: rows, tokens per row, context width (the mask's, a graph's bucket) and the
    columns each row sees (its length; default C)."""
    out = []
    for part in (x.strip() for x in text.split(",")):
        dims, colon, seen = part.partition(":")
        try:
            b, t, c = (int(v) for v in dims.split("x"))
            length = int(seen) if colon else c
        except ValueError:
            out = []
            break
        if min(b, t, c) < 1 or not t <= length <= c:
            out = []
            break
        out.append((b, t, c, length))
    if not out:
        raise argparse.ArgumentTypeError(f"expected BxTxC[:L][,...] with T <= L <= C, got {text!r}")
    return out


def kv_floor_us(b: int, length: int, dtype: torch.dtype, bw: float) -> float:
    """Reading each row's visible K and V once: b · length · HKV · D · 2 tensors · element size,
    over `bw` B/s."""
    return b * length * HKV * D * 2 * torch.finfo(dtype).bits / 8 / bw * 1e6


def inputs(b: int, t: int, c: int, length: int, dtype, device: str):
    g = torch.Generator(device=device).manual_seed(b * 1000 + t)
    q = torch.randn(b, t, HQ, D, generator=g, device=device).to(dtype)
    kc = torch.randn(b + 1, c + 8, HKV, D, generator=g, device=device).to(dtype)
    vc = torch.randn(b + 1, c + 8, HKV, D, generator=g, device=device).to(dtype)
    rows = torch.arange(1, b + 1, device=device)
    pos = (torch.arange(t, device=device) + length - t)[None].expand(b, t)
    mask = torch.arange(c, device=device)[None, None] <= pos[:, :, None]
    return q, kc, vc, rows, mask


def sweep_shape(ta, shape, configs, dtype, device: str, bw: float, reps: int, deadline: float) -> dict:
    b, t, c, length = shape
    q, kc, vc, rows, mask = inputs(b, t, c, length, dtype, device)
    scale = D ** -0.5
    planned = ta.plan(b, t, HQ, HKV, c, D, ta._SMS.get(0, 132))
    ref = ta.attend(q, kc, vc, rows, mask, scale)
    row = {"b": b, "t": t, "c": c, "length": length, "tolerance": _tol(dtype), "plan": {"block_m": planned[0], "block_n": planned[2], "splits": planned[3]},
           "kv_floor_us": kv_floor_us(b, length, dtype, bw),
           "plan_us": graph_us(lambda: ta.attend(q, kc, vc, rows, mask, scale), reps, device), "configs": []}
    for bn, sp, w, skip in configs:
        if time.time() > deadline:
            row["cut_short"] = True
            break
        kw = {"block_n": bn, "splits": sp, "num_warps": w, "skip_hidden": bool(skip)}
        try:
            err = (ta.attend(q, kc, vc, rows, mask, scale, **kw).float() - ref.float()).abs().max().item()
            us = graph_us(lambda: ta.attend(q, kc, vc, rows, mask, scale, **kw), reps, device)
        except Exception as e:  # a launch the hardware refuses (shared memory, say): say so, go on
            row["configs"].append({**kw, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"})
            continue
        row["configs"].append({**kw, "us": us, "max_abs_diff": err})
    ok = [r for r in row["configs"] if "us" in r and r["max_abs_diff"] <= row["tolerance"]]
    if ok:
        row["best"] = min(ok, key=lambda r: r["us"])
    return row


def _tol(dtype) -> float:
    """Two launches of the same attention differ only in summation order."""
    return 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


def lines(row: dict) -> list[str]:
    p, best = row["plan"], row.get("best")
    out = [f"## B={row['b']} T={row['t']} C={row['c']} (rows see {row.get('length', row['c'])}): KV floor {row['kv_floor_us']:.1f} µs; plan() "
           f"(BLOCK_N {p['block_n']}, splits {p['splits']}, 4 warps) {row['plan_us']:.1f} µs "
           f"= {row['plan_us'] / row['kv_floor_us']:.2f}x floor"]
    if best:
        out.append(f"   best: BLOCK_N {best['block_n']}, splits {best['splits']}, {best['num_warps']} warps, "
                   f"{'skipping' if best.get('skip_hidden') else 'reading'} hidden columns "
                   f"{best['us']:.1f} µs = {best['us'] / row['kv_floor_us']:.2f}x floor, "
                   f"{row['plan_us'] / best['us']:.2f}x faster than plan()")
    bad = [r for r in row["configs"] if "error" in r or r.get("max_abs_diff", 0) > row["tolerance"]]
    for r in bad:
        out.append(f"   flagged: BLOCK_N {r['block_n']}, splits {r['splits']}, {r['num_warps']} warps, "
                   f"skip_hidden {r.get('skip_hidden', False)}: "
                   + (r["error"] if "error" in r else f"max |difference| {r['max_abs_diff']:.3g}"))
    if row.get("cut_short"):
        out.append("   (cut short by --max-s)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--shapes", type=_shapes,
                    default=_shapes("64x1x472:320,64x4x472:320,32x4x472:320,64x1x322,1x4x472:320"),
                    help="BxTxC[:L]: rows, tokens per row, mask width (a graph's context bucket), columns seen")
    ap.add_argument("--block-n", type=_ints, default=_ints("32,64,128"))
    ap.add_argument("--splits", type=_ints, default=_ints("1,2,4"))
    ap.add_argument("--warps", type=_ints, default=_ints("4,8"))
    ap.add_argument("--skip-hidden", type=_ints, default=_ints("0,1"), help="0: read every column; 1: skip hidden ones")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-s", type=float, default=80.0, help="start no new launch after this many seconds")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.device == "cpu":
        # Only under TRITON_INTERPRET=1: the interpreter runs the kernels on CPU tensors, and the
        # kernel's wrapper asks CUDA for the SM count, which a CPU host cannot answer.
        torch.cuda.current_device = lambda: 0
    from refengine.models import triton_attend as ta
    ta._SMS.setdefault(0, torch.cuda.get_device_properties(0).multi_processor_count if a.device == "cuda" else 132)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    if a.device == "cuda":
        from decode_roofline import copy_bandwidth
        bw = copy_bandwidth("cuda", gib=2.0)
        gpu = torch.cuda.get_device_name(0)
    else:
        bw, gpu = 50e9, "cpu (Triton interpreter)"
    configs = list(itertools.product(a.block_n, a.splits, a.warps, a.skip_hidden))
    print(f"# attend_sweep on {gpu}: {len(configs)} launches per shape, copy bandwidth {bw / 1e9:.0f} GB/s; "
          f"torch {torch.__version__}", flush=True)
    report = {"device": gpu, "dtype": str(dtype), "bandwidth_GBps": bw / 1e9, "heads": [HQ, HKV, D], "rows": []}
    with torch.no_grad():
        for shape in a.shapes:
            row = sweep_shape(ta, shape, configs, dtype, a.device, bw, a.reps if a.device == "cuda" else 1,
                              t0 + a.max_s)
            report["rows"].append(row)
            print("\n".join(lines(row)), flush=True)
            if a.json:
                Path(a.json).write_text(json.dumps(report, indent=1))
    print(f"# wall {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
