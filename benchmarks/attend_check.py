"""The attention op on the GPU: the Triton kernel against the torch reference, for every shape the
engine uses (decode, chain verify, tree verify, draft steps, padded rows), then both timed inside
CUDA graphs (median of replays, µs), side by side.

GPU (one H200; well under a minute):
    python benchmarks/attend_check.py --out attend_check.json
Fails (exit 1) when the kernel disagrees with the reference beyond the dtype's tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)

import torch  # noqa: E402


from cuda_timing import graph_us  # noqa: E402
from refengine.models import triton_attend  # noqa: E402
from refengine.models.attend import attend, attend_reference  # noqa: E402

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
# (name, batch, tokens, q heads, kv heads, head_dim, context, tree mask)
SHAPES = [
    ("decode 8B", 1, 1, 32, 8, 128, 256, False),
    ("decode 8B ctx 1024", 1, 1, 32, 8, 128, 1024, False),
    ("decode 8B ctx 8192", 1, 1, 32, 8, 128, 8192, False),
    ("decode 8B TP2", 1, 1, 16, 4, 128, 512, False),
    ("verify 4 tokens", 1, 4, 32, 8, 128, 512, False),
    ("verify 4 tokens, batch 8", 8, 4, 32, 8, 128, 512, False),
    ("tree verify 16", 1, 16, 32, 8, 128, 512, True),
    ("tree verify 64, batch 4", 4, 64, 32, 8, 128, 512, True),
    ("draft step topk 4", 2, 4, 32, 8, 128, 256, True),
    ("decode batch 64", 64, 1, 32, 8, 128, 1024, False),
]


def inputs(b, t, hq, hk, d, c, tree, dtype, gen):
    rows_total = b + 1
    q = torch.randn(b, t, hq, d, dtype=dtype, device="cuda", generator=gen)
    kc = torch.randn(rows_total, c + 16, hk, d, dtype=dtype, device="cuda", generator=gen)
    vc = torch.randn(rows_total, c + 16, hk, d, dtype=dtype, device="cuda", generator=gen)
    rows = torch.randperm(rows_total, device="cuda", generator=gen)[:b]
    pos = torch.randint(0, c - t, (b, 1), device="cuda", generator=gen) + torch.arange(t, device="cuda")[None]
    mask = torch.arange(c, device="cuda")[None, None] <= pos[:, :, None]
    if tree:
        mask &= torch.rand(b, t, c, device="cuda", generator=gen) < 0.8
        mask.scatter_(2, pos[:, :, None], True)
    return q, kc, vc, rows, mask


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, bad = [], 0
    print(f"# attend_check on {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    print(f"   {'shape':<26} {'dtype':<9} {'max |err|':>10} {'plan (BM, mblocks, BN, splits)':>31} "
          f"{'triton µs':>10} {'torch µs':>9}")
    for name, b, t, hq, hk, d, c, tree in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            q, kc, vc, r, m = inputs(b, t, hq, hk, d, c, tree, dtype, gen)
            scale = d ** -0.5
            ref = attend_reference(q.double(), kc.double(), vc.double(), r, m, scale)
            got = attend(q, kc, vc, r, m, scale)
            err = (got.double() - ref).abs().max().item()
            ok = err <= TOL[dtype]
            bad += not ok
            plan = triton_attend.plan(b, t, hq, hk, c, d, torch.cuda.get_device_properties(0).multi_processor_count)
            us = graph_us(lambda: attend(q, kc, vc, r, m, scale))
            us_ref = graph_us(lambda: attend_reference(q, kc, vc, r, m, scale))
            rows.append({"shape": name, "dtype": str(dtype), "max_abs_err": err, "ok": ok, "plan": plan,
                         "triton_us": us, "torch_us": us_ref})
            print(f"   {name:<26} {str(dtype)[6:]:<9} {err:10.2e} {str(plan):>31} {us:10.1f} {us_ref:9.1f}"
                  + ("" if ok else "   <-- beyond tolerance"))
    print("PASS" if not bad else f"FAIL: {bad} beyond tolerance")
    if a.out:
        Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                           "rows": rows, "pass": not bad}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
