"""Draft placement side by side on the reference engine: per placement (and step count), the
median per-iteration phase times, the collective time inside each phase, and decode tok/s, with
ratios against `sharded` (SGLang's layout) measured in the same process.

    python benchmarks/placement_bench.py                                   # 2 CPU ranks, tiny-agreeing
    python benchmarks/placement_bench.py --model-path llama-3.1-8b --device cuda --tp-size 2 \\
        --simulate-accept 3.0 --batch 4                                    # 8B-shaped, random weights

Random weights accept ≈ nothing, so `--simulate-accept` forces a realistic acceptance (flagged).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)

PHASES = ("draft", "verify", "verify_sample", "draft_extend", "other")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default="tiny-agreeing")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", default="3", help="comma-separated step counts")
    ap.add_argument("--topk", type=int, default=1)
    ap.add_argument("--num-draft-tokens", type=int, default=None)
    ap.add_argument("--iterations", type=int, default=40, help="measured iterations per setting")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--simulate-accept", default=None)
    ap.add_argument("--emulate-comm-latency", default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    from refengine.client import EngineClient, EngineOptions, GenRequest

    steps_list = [int(s) for s in args.steps.split(",")]
    opts = EngineOptions(model_path=args.model_path, load_format="dummy", tp_size=args.tp_size,
                         device=args.device, dtype=args.dtype, speculative_num_steps=steps_list[0],
                         max_running_requests=args.batch, context_length=4096,
                         speculative_simulate_accept=args.simulate_accept,
                         emulate_comm_latency=args.emulate_comm_latency,
                         threads_per_rank=1 if args.device == "cpu" else None)
    t0 = time.time()
    client = EngineClient.start(opts)
    print(f"# {args.model_path} TP{args.tp_size} {args.device} batch {args.batch}; started in "
          f"{time.time() - t0:.1f} s" + (f"; SIMULATED acceptance {args.simulate_accept}" if args.simulate_accept else "")
          + (f"; EMULATED comm latency {args.emulate_comm_latency}" if args.emulate_comm_latency else ""))
    results = []
    try:
        for steps in steps_list:
            base = None
            for placement in ("sharded", "replicated", "rank0"):
                changes = {"speculative_num_steps": steps, "speculative_eagle_topk": args.topk,
                           "speculative_draft_placement": placement}
                if args.num_draft_tokens:
                    changes["speculative_num_draft_tokens"] = args.num_draft_tokens
                cfg = client.set_config(changes)
                recs = _measure(client, GenRequest, args, cfg["epoch"])
                row = _summarise(placement, steps, recs)
                base = base or row
                row["tok_s_ratio_vs_sharded"] = row["tok_s"] / base["tok_s"]
                results.append(row)
                _print(row)
    finally:
        client.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


def _measure(client, GenRequest, args, epoch):
    need = args.warmup + args.iterations
    done = threading.Event()
    left = [args.batch]

    def cb(u):
        if u.finished:
            left[0] -= 1
            if left[0] == 0:
                done.set()
    seq, _ = client.phase_records(0, 1 << 30)
    tag = time.time_ns()
    # Long enough that the batch stays full for the whole measurement.
    for i in range(args.batch):
        client.submit(GenRequest(f"b{tag}-{i}", [2 * i + 2, 40, 6, 12], max_new_tokens=need * 8 + 64,
                                 ignore_eos=True), cb)
    recs = []
    while len(recs) < need:
        time.sleep(0.05)
        seq, new = client.phase_records(seq, 1 << 30)
        recs += [r for r in new if r["epoch"] == epoch and r["bs"] == args.batch]
    for i in range(args.batch):
        client.abort(f"b{tag}-{i}")
    done.wait(60)
    return recs[args.warmup:need]


def _summarise(placement, steps, recs):
    med = lambda key, p: statistics.median(r[key][p] for r in recs)  # noqa: E731
    wall = statistics.median(r["wall_ms"] for r in recs)
    tokens = sum(r["committed"] for r in recs)
    secs = sum(r["wall_ms"] for r in recs) / 1e3
    return {"placement": placement, "steps": steps, "iterations": len(recs),
            "tau": tokens / sum(r["bs"] for r in recs), "wall_ms": wall, "tok_s": tokens / secs,
            "phase_ms": {p: med("phase_ms", p) for p in PHASES},
            "comm_ms": {p: med("comm_ms", p) for p in PHASES},
            "draft_calls": recs[-1]["comm_calls"]["draft"] + recs[-1]["comm_calls"]["draft_extend"],
            "simulated": recs[-1]["simulated"], "emulated_comm": recs[-1]["emulated_comm"]}


def _print(r):
    ph = " ".join(f"{p}={r['phase_ms'][p]:.2f}" for p in PHASES)
    cm = " ".join(f"{p}={r['comm_ms'][p]:.2f}" for p in ("draft", "verify", "draft_extend"))
    print(f"steps={r['steps']} {r['placement']:<10} tau={r['tau']:.2f} iter={r['wall_ms']:.2f} ms "
          f"tok/s={r['tok_s']:.1f} (x{r['tok_s_ratio_vs_sharded']:.2f} vs sharded) | phase ms {ph} | "
          f"comm ms {cm} | draft collectives/iter {r['draft_calls']}")


if __name__ == "__main__":
    sys.exit(main())
