"""What watching a server costs it: decode tok/s under a constant load with the full set of probes
running (`specdecode-tune record`: /metrics and /server_info at 4 Hz, the phase stream, NVML at
10 Hz on every GPU) against no probe at all, in interleaved windows of one run (A B B A A B ...),
so drift of the machine falls on both sides.

Starts `python -m refengine serve` (default: the shipped tiny model, TP2 on CPU), keeps
--concurrency streaming /generate requests in flight from this process (tokens counted as they
stream), and starts/stops the recorder as a child process for the B windows (its first seconds,
imports and the first poll, are outside the window).

GPU, the H200 pair (about 4 minutes):
    python benchmarks/probe_overhead.py --serve-arg=--device=cuda --serve-arg=--model-path=llama-3.1-8b \\
        --serve-arg=--load-format=dummy --serve-arg=--dtype=bfloat16 --out overhead.json
CPU:
    python benchmarks/probe_overhead.py --window-s 10 --rounds 2

Goal (issue "Performance benchmarks on the H200s", item 3): <= 1 % of tok/s. Prints the measured
ratio; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)

from engine_runs import base_env  # noqa: E402
from tuner.engine_process import EngineProcess  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class StreamLoad:
    """`n` threads, each streaming /generate requests back to back; every received token is
    logged with its arrival time, so any window's tokens can be counted afterwards."""

    def __init__(self, url: str, n: int, tokens: int, vocab: int):
        self.url, self.n, self.tokens, self.vocab = url, n, tokens, vocab
        self.arrivals: list[tuple[float, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def tokens_between(self, t0: float, t1: float) -> int:
        with self._lock:
            return sum(k for t, k in self.arrivals if t0 <= t < t1)

    def _run(self, i: int) -> None:
        import httpx

        prompt = [(31 * i + 7 * j + 5) % max(2, min(self.vocab, 30000)) for j in range(16)]
        with httpx.Client(base_url=self.url, timeout=600) as http:
            while not self._stop.is_set():
                seen = 0
                try:
                    with http.stream("POST", "/generate", json={"input_ids": prompt, "stream": True, "sampling_params": {
                            "max_new_tokens": self.tokens, "temperature": 0, "ignore_eos": True}}) as r:
                        for line in r.iter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            got = len(json.loads(line[6:]).get("output_ids", ()))
                            if got > seen:
                                with self._lock:
                                    self.arrivals.append((time.monotonic(), got - seen))
                                seen = got
                            if self._stop.is_set():
                                break
                except Exception as e:  # noted; the window's count shows the gap
                    self.errors.append(f"{type(e).__name__}: {e}")
                    time.sleep(0.5)


def start_recorder(url: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tuner", "record", url, "--out", str(out), "--overwrite"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def stop_recorder(p: subprocess.Popen) -> str:
    p.send_signal(signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
    return (err or b"").decode(errors="replace")


def recorded(db: Path) -> dict[str, int]:
    """Rows per table of a recording (what the probes produced during its window)."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {t: con.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables if t != "meta"}
        con.close()
        return out
    except sqlite3.Error as e:
        return {"error": str(e)}  # type: ignore[dict-item]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per load request")
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3, help="A/B pairs (order alternates: AB, BA, AB, ...)")
    ap.add_argument("--settle-s", type=float, default=4.0, help="recorder start-up left out of its window")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for serve (repeatable)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    argv_srv = ["--tp-size", str(a.tp_size), "--port", "0", "--max-running-requests", str(max(4, a.concurrency)),
                "--speculative-num-steps", "3"] + a.serve_arg
    srv = EngineProcess.start(argv_srv, env={"PYTHONPATH": str(ROOT), **base_env()}, timeout_s=600, cwd=ROOT)
    report: dict = {"argv": sys.argv[1:], "serve": argv_srv, "windows": []}
    tmp = Path(tempfile.mkdtemp(prefix="probe-overhead-"))
    try:
        import httpx
        vocab = httpx.get(srv.url + "/model_info", timeout=60).json().get("vocab_size") or 128
        load = StreamLoad(srv.url, a.concurrency, a.tokens, vocab)
        load.start()
        print(f"# probe_overhead: serve {' '.join(argv_srv)}; load {a.concurrency} streams x {a.tokens} tokens; "
              f"windows {a.window_s:.0f} s, {a.rounds} A/B pairs")
        time.sleep(max(10.0, a.window_s / 2))          # warm: graphs captured, load steady
        order = []
        for r in range(a.rounds):
            order += ["A", "B"] if r % 2 == 0 else ["B", "A"]
        for i, side in enumerate(order):
            rec = db = None
            if side == "B":
                db = tmp / f"w{i}.sqlite"
                rec = start_recorder(srv.url, db)
                time.sleep(a.settle_s)
            t0 = time.monotonic()
            time.sleep(a.window_s)
            t1 = time.monotonic()
            n = load.tokens_between(t0, t1)
            w = {"side": side, "tok_s": n / (t1 - t0), "tokens": n}
            if rec is not None:
                err = stop_recorder(rec)
                w["recorded"] = recorded(db)
                if rec.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
                    w["recorder_error"] = err.strip().splitlines()[-1:] if err.strip() else rec.returncode
            else:
                time.sleep(1.0)
            report["windows"].append(w)
            print(f"  window {i + 1:>2} {side}: {w['tok_s']:8.1f} tok/s"
                  + (f"   recorded rows {w['recorded']}" if "recorded" in w else ""))
        load.stop()
        a_rates = [w["tok_s"] for w in report["windows"] if w["side"] == "A"]
        b_rates = [w["tok_s"] for w in report["windows"] if w["side"] == "B"]
        ma, mb = statistics.median(a_rates), statistics.median(b_rates)
        report.update(median_none=ma, median_probes=mb, overhead=1 - mb / ma, load_errors=load.errors[:5])
        spread = (max(a_rates) - min(a_rates)) / ma if ma else float("nan")
        print(f"\n## probes' cost on the server (goal <= 1 %)\n   none   {ma:8.1f} tok/s (median of {len(a_rates)})"
              f"\n   probes {mb:8.1f} tok/s (median of {len(b_rates)})\n   cost   {1 - mb / ma:+.2%} "
              f"(window-to-window spread without probes: {spread:.2%})")
        if load.errors:
            print(f"   load errors: {len(load.errors)} (first: {load.errors[0]})")
    finally:
        srv.stop(timeout=60)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
