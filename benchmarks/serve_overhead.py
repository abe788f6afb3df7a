"""What the HTTP server costs on top of the engine, side by side on one running `serve`.

Starts `python -m refengine serve` (default: the shipped tiny model, TP2 on CPU), then:

  tok/s     C concurrent streaming /generate requests for N tokens each: tokens counted by the
            clients (output_ids of the final chunk) / wall time, next to the engine's own decode
            tokens over the same interval (sum of `committed` / sum of `wall_ms` in the phase
            records) -> the ratio is what prefill (not in the decode records), the gaps between
            iterations, tokenizing, HTTP and SSE leave of the engine's decode rate; use long
            generations (--tokens) to make prefill negligible
  latency   median and p95 of /metrics, /server_info and /specdecode/phases?limit=4096 while the
            load runs (what a 4 Hz poller pays)

Usage: python benchmarks/serve_overhead.py [--tp-size 2] [--concurrency 4] [--tokens 128] [--rounds 3]
       [--serve-arg=--speculative-num-steps=3 ...]
Prints the figures and ratios. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

from tuner.engine_process import EngineProcess, EngineStartError  # noqa: E402

PROMPT = "import os\nimport sys\n\n\ndef main("


def stream_one(base: str, tokens: int, out: list[int]) -> None:
    with httpx.Client(base_url=base, timeout=600) as c:
        with c.stream("POST", "/generate", json={"text": PROMPT, "stream": True, "sampling_params": {
                "max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    last = line
            out.append(len(json.loads(last[len("data: "):])["output_ids"]) if last else 0)


def poll_latencies(base: str, stop: threading.Event, lat: dict[str, list[float]]) -> None:
    with httpx.Client(base_url=base, timeout=60) as c:
        while not stop.is_set():
            for path in ("/metrics", "/server_info", "/specdecode/phases?limit=4096"):
                t0 = time.perf_counter()
                c.get(path).raise_for_status()
                lat.setdefault(path, []).append((time.perf_counter() - t0) * 1e3)
            stop.wait(0.25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve flag, e.g. --serve-arg=--device=cuda")
    a = ap.parse_args()
    try:
        # No start-up time limit: a first start on a new host may compile for a long time.
        engine = EngineProcess.start(["--port", "0", "--tp-size", str(a.tp_size), *a.serve_arg],
                                     env={"PYTHONPATH": str(ROOT)}, timeout_s=float("inf"), cwd=ROOT)
    except EngineStartError as e:
        raise SystemExit(str(e)) from None
    base = engine.url
    try:
        http = httpx.Client(base_url=base, timeout=60)
        lat: dict[str, list[float]] = {}
        for rnd in range(a.rounds):
            after = http.get("/specdecode/phases", params={"after": 10**12}).json()["next"]
            stop = threading.Event()
            poller = threading.Thread(target=poll_latencies, args=(base, stop, lat), daemon=True)
            poller.start()
            counts: list[int] = []
            threads = [threading.Thread(target=stream_one, args=(base, a.tokens, counts))
                       for _ in range(a.concurrency)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            stop.set()
            poller.join()
            recs = http.get("/specdecode/phases", params={"after": after, "limit": 4096}).json()["records"]
            eng_tokens = sum(r["committed"] for r in recs)
            eng_s = sum(r["wall_ms"] for r in recs) / 1e3
            client_tps = sum(counts) / wall
            engine_tps = eng_tokens / eng_s if eng_s else float("nan")
            print(f"round {rnd}: clients {sum(counts)} tok in {wall:.2f} s = {client_tps:.1f} tok/s | "
                  f"engine {eng_tokens} tok in {eng_s:.2f} s of iterations = {engine_tps:.1f} tok/s | "
                  f"ratio client/engine = {client_tps / engine_tps:.3f}")
        for path, xs in lat.items():
            xs.sort()
            print(f"{path:32s} median {statistics.median(xs):7.2f} ms   p95 {xs[int(0.95 * (len(xs) - 1))]:7.2f} ms"
                  f"   (n={len(xs)})")
        http.close()
    finally:
        engine.stop(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
