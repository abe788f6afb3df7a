"""Soak of `serve --tp-size 2` under streaming load and live setting changes: errors, /metrics
latency and the RSS of the server and each rank over time (a leak, or warm-up that levels off).

The red team's soak (review-reliability-2, 120 s), for as long as asked: 32 client threads each loop
a streaming /generate (max_new_tokens 32-128, greedy two times in three, else T = 0.7; ignore_eos);
one thread posts /set_internal_state every 2 s, cycling steps 1..5 x placement sharded, replicated,
rank0; one probes /metrics every 0.5 s. The server (CPU, the shipped tiny model) is started here
unless --url is given. Every 10 s the RSS of the server and of each of its children is sampled.

An error is any non-200 reply, an `error` event in a stream, an abort finish reason, or a
connection failure. RSS "after warm-up" is read at --warmup seconds; the trend after it is a least-
squares slope in MB per hour.

    python benchmarks/serve_soak.py --seconds 1800 --json benchmarks/results/serve_soak_30min.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

from tuner.engine_process import EngineProcess, EngineStartError  # noqa: E402

STEPS = [1, 2, 3, 4, 5]
PLACEMENTS = ["sharded", "replicated", "rank0"]


def rss_mb(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else math.nan


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def name_of(pid: int, i: int) -> str:
    """A child's label: the multiprocessing resource tracker, or a rank (in start order)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"child{i}"
    return "resource_tracker" if b"resource_tracker" in cmd else f"child{i}"


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.errors = self.tokens = 0
        self.error_examples: list[str] = []
        self.e2e: list[float] = []
        self.ttft: list[float] = []
        self.changes: list[float] = []
        self.change_errors = 0
        self.metrics: list[float] = []
        self.metrics_errors = 0

    def error(self, what: str) -> None:
        with self.lock:
            self.errors += 1
            if len(self.error_examples) < 10:
                self.error_examples.append(what[:300])


def stream_client(url: str, stop: threading.Event, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=300) as c:
        while not stop.is_set():
            sp = {"max_new_tokens": rng.randint(32, 128), "ignore_eos": True,
                  "temperature": 0 if rng.random() < 2 / 3 else 0.7}
            body = {"text": f"Soak {seed} {rng.random():.6f}: once upon a time", "stream": True, "sampling_params": sp}
            t0 = time.monotonic()
            first = None
            last: dict = {}
            try:
                with c.stream("POST", "/generate", json=body) as r:
                    if r.status_code != 200:
                        r.read()
                        tally.error(f"HTTP {r.status_code}: {r.text[:200]}")
                        continue
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        d = json.loads(line[6:])
                        if "error" in d:
                            tally.error(f"error event: {d['error']}")
                            last = {}
                            break
                        first = first or time.monotonic()
                        last = d
            except (httpx.HTTPError, ValueError) as e:
                tally.error(f"{type(e).__name__}: {e}")
                continue
            if not last:
                continue
            reason = (last.get("meta_info") or {}).get("finish_reason") or {}
            if reason.get("type") == "abort":
                tally.error(f"abort: {reason}")
                continue
            with tally.lock:
                tally.requests += 1
                tally.tokens += len(last.get("output_ids") or [])
                tally.e2e.append(time.monotonic() - t0)
                if first is not None:
                    tally.ttft.append(first - t0)


def changer(url: str, stop: threading.Event, tally: Tally, every_s: float) -> None:
    cycle = itertools.cycle([(s, p) for p in PLACEMENTS for s in STEPS])
    with httpx.Client(base_url=url, timeout=300) as c:
        while not stop.wait(every_s):
            steps, placement = next(cycle)
            t0 = time.monotonic()
            try:
                r = c.post("/set_internal_state", json={"server_args": {
                    "speculative_num_steps": steps, "speculative_draft_placement": placement}})
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            with tally.lock:
                tally.changes.append(time.monotonic() - t0)
                tally.change_errors += not ok


def metrics_probe(url: str, stop: threading.Event, tally: Tally) -> None:
    with httpx.Client(base_url=url, timeout=300) as c:
        while not stop.wait(0.5):
            t0 = time.monotonic()
            try:
                ok = c.get("/metrics").status_code == 200
            except httpx.HTTPError:
                ok = False
            with tally.lock:
                tally.metrics.append(time.monotonic() - t0)
                tally.metrics_errors += not ok


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def slope_mb_per_hour(pts: list[tuple[float, float]]) -> float:
    if len(pts) < 2:
        return math.nan
    mt, mm = statistics.fmean(t for t, _ in pts), statistics.fmean(m for _, m in pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return round(sum((t - mt) * (m - mm) for t, m in pts) / var * 3600, 1) if var else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1800.0, help="how long the load runs (default 30 min)")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--change-every", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=120.0, help="RSS after warm-up is read here (seconds)")
    ap.add_argument("--url", default=None, help="soak this server instead of starting one (RSS then not sampled)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()

    server = None
    url = args.url
    if url is None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        try:
            server = EngineProcess.start(["--tp-size", "2", "--port", "0", "--device", "cpu"], env=env,
                                         timeout_s=300.0, cwd=ROOT)
        except EngineStartError as e:
            raise SystemExit(f"serve did not start: {e}") from None
        url = server.url
    tally, stop = Tally(), threading.Event()
    threads = [threading.Thread(target=stream_client, args=(url, stop, tally, i), daemon=True)
               for i in range(args.streams)]
    threads += [threading.Thread(target=changer, args=(url, stop, tally, args.change_every), daemon=True),
                threading.Thread(target=metrics_probe, args=(url, stop, tally), daemon=True)]
    rss: list[dict] = []
    t0 = time.monotonic()

    def sample() -> None:
        if server is None:
            return
        procs = {"server": server.pid, **{name_of(p, i): p for i, p in enumerate(children(server.pid))}}
        rss.append({"t": round(time.monotonic() - t0, 1), **{k: round(rss_mb(p), 1) for k, p in procs.items()}})

    sample()
    for t in threads:
        t.start()
    end = t0 + args.seconds
    while time.monotonic() < end:
        time.sleep(min(10.0, max(0.0, end - time.monotonic())))
        sample()
        with tally.lock:
            print(f"{time.monotonic() - t0:6.0f} s  requests {tally.requests}  errors {tally.errors}  "
                  f"changes {len(tally.changes)}  /metrics max {max(tally.metrics, default=0):.2f} s  "
                  f"rss {rss[-1] if rss else '-'}", file=sys.stderr, flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=300)
    wall = time.monotonic() - t0
    sample()
    slots = httpx.get(url + "/specdecode/slots", timeout=60).json()
    if server is not None:
        server.stop(timeout=60.0)

    procs = sorted({k for r in rss for k in r if k != "t"})
    after = next((r for r in rss if r["t"] >= args.warmup), rss[-1] if rss else {})
    memory = {p: {"start_mb": rss[0].get(p), "after_warmup_mb": after.get(p), "end_mb": rss[-1].get(p),
                  "trend_after_warmup_mb_per_hour": slope_mb_per_hour(
                      [(r["t"], r[p]) for r in rss if r["t"] >= args.warmup and p in r and not math.isnan(r[p])])}
              for p in procs} if rss else {}
    result = {
        "seconds": args.seconds, "wall_s": round(wall, 1), "streams": args.streams,
        "requests": tally.requests, "errors": tally.errors, "error_examples": tally.error_examples,
        "tokens": tally.tokens, "client_tok_per_s": round(tally.tokens / wall, 1),
        "e2e_p50_s": pct(tally.e2e, 0.5), "e2e_p99_s": pct(tally.e2e, 0.99),
        "ttft_p50_s": pct(tally.ttft, 0.5), "ttft_p99_s": pct(tally.ttft, 0.99),
        "setting_changes": len(tally.changes), "setting_change_errors": tally.change_errors,
        "setting_change_p50_s": pct(tally.changes, 0.5), "setting_change_max_s": pct(tally.changes, 1.0),
        "metrics_probes": len(tally.metrics), "metrics_errors": tally.metrics_errors,
        "metrics_p50_s": pct(tally.metrics, 0.5), "metrics_p99_s": pct(tally.metrics, 0.99),
        "metrics_max_s": pct(tally.metrics, 1.0), "metrics_over_1s": sum(m >= 1.0 for m in tally.metrics),
        "memory": memory, "slots_after": slots, "rss_samples": rss,
    }
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rss_samples"}, indent=1))
    return 0 if tally.errors == 0 and tally.change_errors == 0 and tally.metrics_errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
