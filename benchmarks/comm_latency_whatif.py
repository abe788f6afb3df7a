"""Does the communication what-if predict a relaunch? The reference engine at TP 2 on CPU, launched
with `--emulate-comm-latency A` and without, alternately: each launch's median settled decode
iteration is predicted from the other launch's records (tuner.tuning.comm_whatif.emulated: every
collective per iteration moves by the latency difference) and compared with what the relaunch
measured. This checks the model's arithmetic on real rank processes, not PCIe hardware: sleep
cannot emulate a few microseconds.

    python benchmarks/comm_latency_whatif.py [--latency-us 200] [--rounds 3] [--iterations 120]

Prints, per round and direction, predicted and measured median iteration (ms) and their ratio,
then the same over all launches: each latency's median of its launches' medians, predicted from
the other's (the goal: within 1 ± 0.10). A single relaunch also carries the host's launch-to-launch
spread, printed as the range of the pairwise ratios. `--from-json FILE` recomputes from a saved run.
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


def measure(latency_us: float | None, args) -> dict:
    """One launch: the median settled iteration and the mean collectives per iteration by phase."""
    from refengine.client import EngineClient, EngineOptions, GenRequest
    from refengine.server.app import default_model

    opts = EngineOptions(**default_model(), tp_size=2, device="cpu", speculative_num_steps=args.steps,
                         max_running_requests=args.batch, context_length=4096,
                         emulate_comm_latency=None if latency_us is None else f"{latency_us:g}",
                         threads_per_rank=1)
    client = EngineClient.start(opts)
    try:
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
        for i in range(args.batch):        # long enough that the batch stays full throughout
            client.submit(GenRequest(f"b{tag}-{i}", [2 * i + 2, 40, 6, 12], max_new_tokens=need * 8 + 64,
                                     ignore_eos=True), cb)
        recs: list[dict] = []
        while len(recs) < need:
            time.sleep(0.05)               # polling the engine's ring (a benchmark, not a test)
            seq, new = client.phase_records(seq, 1 << 30)
            recs += [r for r in new if r["bs"] == args.batch and not r.get("captures")]
        for i in range(args.batch):
            client.abort(f"b{tag}-{i}")
        done.wait(60)
    finally:
        client.close()
    recs = recs[args.warmup:need]
    calls = {p: statistics.fmean(r["comm_calls"].get(p, 0) for r in recs) for p in recs[0]["comm_calls"]}
    return {"latency_us": latency_us or 0.0, "iterations": len(recs),
            "median_ms": statistics.median(r["wall_ms"] for r in recs),
            "comm_ms": statistics.median(sum(r["comm_ms"].values()) for r in recs),
            "phase_ms": {p: round(statistics.median(r["phase_ms"][p] for r in recs), 3) for p in recs[0]["phase_ms"]},
            "phase_comm_ms": {p: round(statistics.median(r["comm_ms"].get(p, 0.0) for r in recs), 3)
                              for p in recs[0]["phase_ms"]},
            "calls": calls, "emulated_comm": recs[-1].get("emulated_comm")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-us", type=float, default=200.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--from-json", default=None, help="recompute the summary from a saved run")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        return summarise(saved["rows"], saved["launches"])
    from tuner.tuning.comm_whatif import emulated

    rows, launches = [], []
    for r in range(args.rounds):
        on = measure(args.latency_us, args)
        off = measure(None, args)
        for m in (on, off):
            launches.append({"round": r, **m})
            print(f"  launch {m['latency_us']:g} µs: median iteration {m['median_ms']:.2f} ms, collectives "
                  f"{m['comm_ms']:.2f} ms; phase ms {m['phase_ms']}; comm ms {m['phase_comm_ms']}", flush=True)
        for src, dst in ((on, off), (off, on)):
            p = emulated(src["median_ms"], src["calls"], src["latency_us"], dst["latency_us"])
            row = {"round": r, "from_us": src["latency_us"], "to_us": dst["latency_us"],
                   "calls_per_iter": round(sum(src["calls"].values()), 2),
                   "predicted_ms": round(p.predicted_ms, 3), "measured_ms": round(dst["median_ms"], 3),
                   "ratio": round(p.predicted_ms / dst["median_ms"], 4)}
            rows.append(row)
            print(f"round {r}: {src['latency_us']:g} µs → {dst['latency_us']:g} µs: predicted "
                  f"{row['predicted_ms']:.2f} ms, measured {row['measured_ms']:.2f} ms, ratio {row['ratio']:.3f} "
                  f"({row['calls_per_iter']:.1f} collectives/iteration)", flush=True)
    ok = summarise(rows, launches) == 0
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "launches": launches, "met": ok},
                                              indent=1))
    return 0


def summarise(rows: list[dict], launches: list[dict]) -> int:
    """Print the pairwise spread and the pooled verdict; 0 when the pooled goal is met."""
    from tuner.tuning.comm_whatif import emulated

    ratios = [x["ratio"] for x in rows]
    print(f"pairwise ratio predicted/measured: median {statistics.median(ratios):.3f}, range {min(ratios):.3f} … "
          f"{max(ratios):.3f} over {len(ratios)} relaunches")
    by = {}
    for m in launches:
        by.setdefault(m["latency_us"], []).append(m)
    pooled = {lat: {"median_ms": statistics.median(m["median_ms"] for m in ms),
                    "calls": {p: statistics.fmean(m["calls"][p] for m in ms) for p in ms[0]["calls"]},
                    "spread": (min(m["median_ms"] for m in ms), max(m["median_ms"] for m in ms))}
              for lat, ms in by.items()}
    met = True
    lats = sorted(pooled)
    for src, dst in ((lats[-1], lats[0]), (lats[0], lats[-1])):
        p = emulated(pooled[src]["median_ms"], pooled[src]["calls"], src, dst)
        got = pooled[dst]["median_ms"]
        r = p.predicted_ms / got
        met &= abs(r - 1) <= 0.10
        lo, hi = pooled[dst]["spread"]
        print(f"over launches: {src:g} µs → {dst:g} µs: predicted {p.predicted_ms:.2f} ms, measured median "
              f"{got:.2f} ms (launches {lo:.2f} … {hi:.2f}), ratio {r:.3f}")
    print(f"goal: the median over launches within 1 ± 0.10: {'MET' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
