"""Time to first token under load, before and after batched prefill, side by side in one run.

Starts two `serve` processes with the same flags: "before" with $SPECDECODE_PREFILL_ONE_AT_A_TIME=1
(every waiting request prefilled in its own forward, as the engine did before it batched them) and
"after" (SGLang's PrefillAdder batches: refengine/engine.py). Each trial sends the same open-loop
Poisson script (benchmarks/open_loop.py: arrivals do not wait for answers) to one server, then to
the other, the order alternating by trial so host drift favours neither; between arms it waits
until the server holds nothing. Per request it keeps the client's times: TTFT (first streamed
token - sent), end-to-end and TPOT; per arm the server's own sglang:time_to_first_token_seconds
and sglang:queue_time_seconds (sum / count over the trial) as a cross-check.

    python benchmarks/prefill_ttft.py --trials 5 --rates 10,20 --requests 60 --burst 8 --json OUT.json
    python benchmarks/prefill_ttft.py --device cuda --model-path llama-3.1-8b ... (dummy weights)

Prints per trial the median TTFT of each arm and their ratio, then per load the median over trials
with the spread (min-max); asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

from open_loop import OpenLoop  # noqa: E402

ARMS = {"before": {"SPECDECODE_PREFILL_ONE_AT_A_TIME": "1"}, "after": {}}


def prompts(n: int, length: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    """`n` prompts of `length` tokens: slices of this repository's Python source as bytes (what the
    shipped byte-level model was trained on), or random ids below `vocab` for a larger vocabulary."""
    rng = random.Random(seed)
    if vocab <= 264:
        text = b"".join(p.read_bytes() for p in sorted((ROOT / "refengine").glob("*.py")))
        starts = [rng.randrange(0, len(text) - length) for _ in range(n)]
        return [{"input_ids": list(text[s: s + length])} for s in starts]
    return [{"input_ids": [rng.randrange(1000, vocab) for _ in range(length)]} for _ in range(n)]


def poisson(rate: float, n: int, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def histogram_totals(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the server's TTFT and queue-time histograms, all label sets together."""
    text = httpx.get(url + "/metrics", timeout=30).text
    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in ("sglang:time_to_first_token_seconds", "sglang:queue_time_seconds"):
            acc = out.setdefault(fam.name, [0.0, 0.0])
            for s in fam.samples:
                if s.name.endswith("_sum"):
                    acc[0] += s.value
                elif s.name.endswith("_count"):
                    acc[1] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def wait_idle(url: str, timeout_s: float = 300.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        s = httpx.get(url + "/specdecode/slots", timeout=30).json()
        if not (s["running"] or s["waiting"] or s["reserved_rids"] or s["engine_requests"]):
            return
        time.sleep(0.2)
    raise SystemExit(f"{url} still holds requests after {timeout_s:.0f} s")


def one_arm(url: str, ps: list[dict], offsets: list[float], max_new: int) -> dict[str, Any]:
    wait_idle(url)
    before = histogram_totals(url)
    ol = OpenLoop(url, ps, max_new)
    try:
        res = ol.run(offsets)
    finally:
        ol.close()
    after = histogram_totals(url)
    errors = [r["error"] for r in res if r.get("error")]
    ok = [r for r in res if not r.get("error") and r.get("first")]
    ttft = [r["first"] - r["sent"] for r in ok]
    e2e = [r["done"] - r["sent"] for r in ok]
    tpot = [(r["done"] - r["first"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    server = {}
    for name, (s1, c1) in after.items():
        s0, c0 = before.get(name, (0.0, 0.0))
        server[name.split(":")[1]] = (s1 - s0) / (c1 - c0) if c1 > c0 else None
    return {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot, "errors": errors[:5], "n_errors": len(errors),
            "server_mean": server}


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def run_load(servers: dict[str, Any], ps: list[dict], rate: float, a, burst: int = 0) -> dict[str, Any]:
    """`a.trials` trials at one arrival rate (or `burst` requests sent at once, rate 0), each arm in
    turn (order alternating) -> the figures."""
    trials: list[dict[str, Any]] = []
    print(f"== {rate:g} requests/s, {a.requests} requests a trial" if not burst else
          f"== a burst of {burst} requests at once", flush=True)
    for t in range(a.trials):
        offsets = poisson(rate, a.requests, a.seed + t) if not burst else [0.0] * burst
        order = list(ARMS) if t % 2 == 0 else list(ARMS)[::-1]
        row: dict[str, Any] = {"trial": t, "order": order}
        for arm in order:
            row[arm] = one_arm(servers[arm].url, ps, offsets, a.max_new_tokens)
        mb, ma = (statistics.median(row[x]["ttft_s"]) for x in ("before", "after"))
        row["ttft_median_ratio"] = mb / ma
        trials.append(row)
        print(f"trial {t}: TTFT median before {mb * 1e3:.1f} ms, after {ma * 1e3:.1f} ms, "
              f"before/after {mb / ma:.2f}; errors {row['before']['n_errors']}/{row['after']['n_errors']}",
              flush=True)

    def pooled(arm: str, key: str) -> list[float]:
        return [x for row in trials for x in row[arm][key]]

    summary: dict[str, Any] = {"rate": rate, "burst": burst}
    for arm in ARMS:
        tt, e2e, tp = pooled(arm, "ttft_s"), pooled(arm, "e2e_s"), pooled(arm, "tpot_s")
        per_trial = [statistics.median(row[arm]["ttft_s"]) for row in trials]
        summary[arm] = {"ttft_median_s": statistics.median(tt), "ttft_p90_s": q(tt, 0.9),
                        "ttft_trial_medians_s": per_trial, "e2e_median_s": statistics.median(e2e),
                        "tpot_median_s": statistics.median(tp) if tp else None, "requests": len(tt)}
        s = summary[arm]
        print(f"{arm:>6}: TTFT median {s['ttft_median_s'] * 1e3:.1f} ms (p90 {s['ttft_p90_s'] * 1e3:.1f}), "
              f"trial medians {min(per_trial) * 1e3:.1f}-{max(per_trial) * 1e3:.1f} ms; "
              f"e2e median {s['e2e_median_s'] * 1e3:.0f} ms; TPOT median "
              f"{(s['tpot_median_s'] or float('nan')) * 1e3:.1f} ms; {s['requests']} requests", flush=True)
    ratios = [row["ttft_median_ratio"] for row in trials]
    summary["ttft_ratio_before_over_after"] = {"median": statistics.median(ratios), "min": min(ratios),
                                               "max": max(ratios), "per_trial": ratios}
    print(f"TTFT before/after at {f'{rate:g}/s' if not burst else f'a burst of {burst}'} (ratio of trial "
          f"medians): median {statistics.median(ratios):.2f}, "
          f"min {min(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} trials", flush=True)
    return {"summary": summary, "trials": trials}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--model-path", default=None, help="default: the shipped tiny model")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--rates", default="10,20", help="arrivals per second (Poisson), one load per value")
    ap.add_argument("--requests", type=int, default=60, help="requests per trial and arm")
    ap.add_argument("--burst", type=int, default=0,
                    help="also N requests sent at once to an idle server, per trial and arm")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-running-requests", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=264, help="prompt ids below this (the model's vocabulary)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-args", default="", help="more serve flags, one string")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from tuner.engine_process import EngineProcess

    args = ["--device", a.device, "--tp-size", str(a.tp), "--port", "0", "--host", "127.0.0.1",
            "--max-running-requests", str(a.max_running_requests), "--random-seed", str(a.seed),
            "--context-length", str(a.prompt_len + a.max_new_tokens + 64), *a.server_args.split()]
    if a.model_path:
        args += ["--model-path", a.model_path]
        if not Path(a.model_path).exists():
            args += ["--load-format", "dummy"]
    print(f"# serve {' '.join(args)}", flush=True)
    rates = [float(x) for x in a.rates.split(",") if x]
    servers: dict[str, Any] = {}
    loads: list[dict[str, Any]] = []
    try:
        def start(arm: str) -> None:
            servers[arm] = EngineProcess.start(args, env={"PYTHONPATH": str(ROOT), **ARMS[arm]}, timeout_s=900,
                                               cwd=ROOT)
        starters = [threading.Thread(target=start, args=(arm,)) for arm in ARMS]
        for th in starters:
            th.start()
        for th in starters:
            th.join()
        if set(servers) != set(ARMS):
            raise SystemExit("a server did not start")
        for arm in ARMS:
            print(f"# {arm}: {servers[arm].url}", flush=True)
        ps = prompts(a.requests, a.prompt_len, a.vocab, a.seed)
        # Warm-up: each server's first requests pay one-off costs (graph captures on CUDA).
        for arm in ARMS:
            one_arm(servers[arm].url, ps, poisson(max(rates or [10.0]), a.requests, a.seed + 99), a.max_new_tokens)
        for rate, burst in [(r, 0) for r in rates] + ([(0.0, a.burst)] if a.burst else []):
            loads.append(run_load(servers, ps, rate, a, burst))
            if a.json:     # after each load: a run cut short keeps what it measured
                Path(a.json).write_text(json.dumps({"serve": args, "params": vars(a), "loads": loads}, indent=1))
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
