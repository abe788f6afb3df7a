"""Why a closed loop of equal-length requests is not a server's load: lockstep waves.

Starts one `serve` (schedule_ab's: simulated 8B curve, `--max-running-requests C`), holds a
closed loop of C streams, and for each output-length spread (schedule_ab's `--length-spread`) and
chain setting runs `--hold-s` seconds, then prints from the phase records: tok/s over the hold,
the 1-s windows (median, min), the longest gap between iterations, the share of iterations run
below half the batch, and the mean batch. With every request the same length and nothing to break
the tie (steps 0 commits one token per request per iteration) the batch finishes together, drains,
waits for its clients and refills together: each wave's gap shows as a near-empty window.

Every 0.25 s it also samples the requests in flight on each side: the load driver's, and the
server's running and queued (/metrics). Where those stay at C while the engine's batch does not, the
gap is between the server and the engine. That is how the per-request output messages were found:
benchmarks/results/closed_loop_waves_h200.md. `--records` keeps each hold's phase records.

    python benchmarks/closed_loop_waves.py --device cuda --steps 0,1,4 --spreads 0,0.5 --json OUT.json

Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

import schedule_ab as sa  # noqa: E402
import schedule_stats as st  # noqa: E402
from engine_runs import base_env  # noqa: E402


def summarise(recs: list[dict], t0: float, t1: float, c: int, settle_s: float) -> dict:
    ts = [r["t"] for r in recs]
    settled = st.settled_from(t0, ts, settle_s)
    used = [r for r in recs if r["t"] >= settled]
    wins = st.window_rates([r["t"] for r in used], [r["committed"] for r in used], settled, t1)
    gaps = [b - a for a, b in zip([settled] + [r["t"] for r in used], [r["t"] for r in used] + [t1])]
    return {"iterations": len(used), "tok_s": sum(r["committed"] for r in used) / max(1e-9, t1 - settled),
            "windows": wins, "window_median": statistics.median(wins) if wins else None,
            "window_min": min(wins) if wins else None, "longest_gap_s": max(gaps) if gaps else None,
            "below_half_batch": sum(r["bs"] < c / 2 for r in used) / len(used) if used else None,
            "mean_bs": statistics.fmean(r["bs"] for r in used) if used else None,
            "captures": sum(bool(r.get("capture")) for r in used)}


METRIC = re.compile(r"^sglang:(num_running_reqs|num_queue_reqs)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def sample_load(b: "sa.Bench", url: str, until: float, every_s: float = 0.25) -> list[dict]:
    """Hold the load until `until`, collecting records, and every `every_s` sample the requests in
    flight on each side: the load driver's (sent, not finished) and the server's running and
    queued ones (/metrics). Where they differ from the engine's batch the gap is on that side."""
    import httpx

    out = []
    with httpx.Client(base_url=url, trust_env=False, timeout=5.0) as h:
        while time.time() < until:
            b.hold(min(every_s, max(0.0, until - time.time())))
            got = dict(METRIC.findall(h.get("/metrics").text))
            out.append({"client_inflight": b.driver.inflight if b.driver else 0,
                        "server_running": float(got.get("num_running_reqs", "nan")),
                        "server_queued": float(got.get("num_queue_reqs", "nan"))})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--concurrency", "-C", type=int, default=None)
    p.add_argument("--steps", default="0,1,4")
    p.add_argument("--spreads", default="0,0.5")
    p.add_argument("--hold-s", type=float, default=10.0)
    p.add_argument("--json", default=None)
    p.add_argument("--records", action="store_true", help="keep each hold's phase records in --json")
    a = p.parse_args(argv)
    steps = [int(x) for x in a.steps.split(",")]
    spreads = [float(x) for x in a.spreads.split(",")]
    sab = sa.parse(["--device", a.device, "--only", "sweep", "--length-spread", str(max(spreads)),
                    *(["-C", str(a.concurrency)] if a.concurrency else [])])
    from tuner.engine_process import EngineProcess
    import httpx

    args = sa.serve_args(sab)
    print(f"# serve {' '.join(args)}", flush=True)
    eng = EngineProcess.start(args, env={"PYTHONPATH": str(ROOT), **base_env()}, timeout_s=900, cwd=ROOT,
                              die_with_parent=True)
    out: list[dict] = []
    try:
        vocab = int(httpx.get(eng.url + "/model_info", timeout=30).json().get("vocab_size") or 128)
        for spread in spreads:
            b = sa.Bench(eng.url, sa.prompts_for(sab.seed, vocab, max_new_tokens=sab.max_new_tokens, spread=spread),
                         sab.max_new_tokens)
            try:
                for s in steps:
                    b.apply({"speculative_adaptive_config": None, "speculative_num_steps": s})
                    b.set_load(sab.concurrency)       # a fresh loop: every stream starts at once
                    t0 = time.time()
                    seen = sample_load(b, eng.url, t0 + a.hold_s)
                    t1 = time.time()
                    b.caught_up(t1)
                    m = summarise([r for r in b.records if t0 <= r["t"] <= t1], t0, t1, sab.concurrency, sab.settle_s)
                    m.update({k: statistics.fmean(x[k] for x in seen) if seen else None
                              for k in ("client_inflight", "server_running", "server_queued")})
                    out.append({"spread": spread, "steps": s, **m})
                    if a.records:
                        keep = ("t", "t_launch", "wall_ms", "bs", "committed", "steps", "capture", "phase_ms",
                                "dropped")
                        out[-1]["records"] = [{k: r[k] for k in keep if k in r}
                                              for r in b.records if t0 <= r["t"] <= t1]
                    print(f"spread {spread:<4g} steps {s}: {m['tok_s']:8.1f} tok/s  1-s windows median "
                          f"{m['window_median'] or 0:8.1f} min {m['window_min'] or 0:8.1f}  longest gap "
                          f"{m['longest_gap_s'] or 0:6.3f} s  below half batch {100 * (m['below_half_batch'] or 0):5.1f} %"
                          f"  mean bs {m['mean_bs'] or 0:5.1f}  captures {m['captures']}; in flight: client "
                          f"{m['client_inflight'] or 0:.1f}, server running {m['server_running'] or 0:.1f} "
                          f"queued {m['server_queued'] or 0:.1f}", flush=True)
                    b.set_load(0)
            finally:
                b.close()
    finally:
        eng.stop(timeout=60)
    if a.json:
        Path(a.json).write_text(json.dumps({"serve": args, "concurrency": sab.concurrency,
                                            "max_new_tokens": sab.max_new_tokens, "runs": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
