"""What the headless core costs, side by side with what a live session asks of it.

Measures, on this machine: parsing one SGLang-sized /metrics body (against the 4 Hz poll period),
the store's append and 60-s window query, the Recorder's sustained write rate (against the record
rate of a server plus an 8-GPU NVML sampler), and one A/B comparison (cold and cached). Prints each
figure with the ratio to its budget. No server is needed.

    python benchmarks/core_bench.py
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tuner.backends.derive import MetricsDeriver
from tuner.backends.promtext import parse_metrics
from tuner.core import ab, windows
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.core.store import Store
from tuner.recording import Recorder

POLL_S = 0.25
LIVE_RECORDS_PER_S = 4 * 60 + 10 * 8 * 12      # ~60 server series at 4 Hz + 8 GPUs x 12 metrics at 10 Hz


def sglang_like_metrics(scale: int) -> str:
    reg = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
    for name in ("num_running_reqs", "num_queue_reqs", "gen_throughput", "token_usage", "spec_accept_length",
                 "spec_accept_rate", "spec_num_steps", "spec_num_draft_tokens", "utilization", "fwd_occupancy"):
        Gauge(f"sglang:{name}", "x", labels, registry=reg).labels("m", "unified", "0", "0", "0").set(scale)
    c = Counter("sglang:realtime_tokens", "x", [*labels, "mode"], registry=reg)
    for mode in ("decode", "prefill_compute", "prefill_cache"):
        c.labels("m", "unified", "0", "0", "0", mode).inc(1000 * scale)
    f = Counter("sglang:forward_execution_seconds", "x", [*labels, "category"], registry=reg)
    for cat in ("eagle_draft", "eagle_draft_extend", "target_verify", "decode", "extend", "idle"):
        f.labels("m", "unified", "0", "0", "0", cat).inc(scale)
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "request_time_per_output_token_seconds"):
        h = Histogram(f"sglang:{name}", "x", ["model_name", "engine_type"], registry=reg,
                      buckets=[0.001 * 2 ** i for i in range(20)])
        for i in range(50):
            h.labels("m", "unified").observe(0.001 * i * scale)
    k = Counter("specdecode:accept_position", "x", ["k"], registry=reg)
    for i in range(8):
        k.labels(str(i)).inc(100 * scale // (i + 1))
    return generate_latest(reg).decode()


def timed(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main() -> None:
    text = sglang_like_metrics(3)
    n_lines = text.count("\n")
    parse_s = timed(lambda: parse_metrics(text), 200)
    d = MetricsDeriver(acceptance=True, phases=True)
    step = [0.0]

    def derive():
        step[0] += POLL_S
        d.update(step[0], parse_metrics(text))
    derive_s = timed(derive, 200)
    print(f"/metrics parse ({n_lines} lines): {parse_s * 1e3:.2f} ms; parse+derive {derive_s * 1e3:.2f} ms "
          f"= {derive_s / POLL_S * 100:.2f} % of one core at 4 Hz")

    st = Store()
    samples = [Sample(i * 0.25, f"s{i % 60}", float(i)) for i in range(240_000)]
    t = time.perf_counter()
    st.add_many(samples)
    add_s = (time.perf_counter() - t) / len(samples)
    win_s = timed(lambda: st.window("s7", 1000.0 * 60 - 60, 1000.0 * 60), 2000)
    print(f"store append: {add_s * 1e6:.2f} us/record ({1 / add_s / LIVE_RECORDS_PER_S:.0f}x the live rate); "
          f"60-s window query: {win_s * 1e6:.1f} us")

    with tempfile.TemporaryDirectory() as tmp:
        rec = Recorder(Path(tmp) / "bench.db", {"backend": "bench"})
        batch = [Sample(i * 0.01, f"gpu{i % 8}/m{i % 12}", float(i)) for i in range(LIVE_RECORDS_PER_S // 4)]
        n = 0
        t = time.perf_counter()
        while time.perf_counter() - t < 3.0:
            rec.write(batch)
            n += len(batch)
        rec.flush(60)
        el = time.perf_counter() - t
        rec.close()
        size = (Path(tmp) / "bench.db").stat().st_size
        print(f"recorder: {n / el:,.0f} records/s sustained = {n / el / LIVE_RECORDS_PER_S:.0f}x an 8-GPU live "
              f"session ({LIVE_RECORDS_PER_S} records/s); {size / n:.1f} bytes/record on disk")

    st = Store()
    st.add_many(Sample(i * 0.25, "server/tok_per_s", 100 + (i % 7)) for i in range(4 * 240))
    st.add_many([Event(120.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": {}})])
    cold = timed(lambda: (windows._ratio_of_medians.cache_clear(), ab.compare_last_change(st, "server/tok_per_s", 240.0)), 3)
    warm = timed(lambda: ab.compare_last_change(st, "server/tok_per_s", 240.0), 50)
    r = ab.compare_last_change(st, "server/tok_per_s", 240.0)
    print(f"A/B ({r.n_before}+{r.n_after} windows, {ab.BOOTSTRAP_ROUNDS} bootstrap rounds): cold {cold * 1e3:.0f} ms, "
          f"cached {warm * 1e3:.2f} ms (= {warm / POLL_S * 100:.2f} % of a 4 Hz tick)")
    assert math.isfinite(r.ratio)


if __name__ == "__main__":
    main()
