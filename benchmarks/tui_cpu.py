"""The TUI's own CPU use at a 4 Hz tick with 8 GPU rows, side by side with an idle app and 1 GPU row.

Runs the real app headless (Textual's compositor still draws every frame) over a real Session whose
bus is fed at 4 Hz by a producer thread with the series a live server and an 8-GPU NVML sampler
produce (synthetic values: this measures drawing, not measuring). Prints CPU seconds per wall second
of this process for each case and the ratios.

    python benchmarks/tui_cpu.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import threading
import time

from tuner.app import make_app
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.core.session import Session

ACTIVE = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
          "speculative_draft_placement": "sharded"}


def feed(session: Session, gpus: int, hz: float, stop: threading.Event) -> None:
    rnd = random.Random(0)
    now = session.now()
    session.put(Event(now, EventKind.CONNECTED, {"url": "http://127.0.0.1:30000", "after_s": 0}))
    session.put(Event(now, EventKind.SERVER_INFO, {"kind": "refengine", "version": "bench", "model": "tiny",
                                                   "tp_size": max(gpus, 1), "active": ACTIVE}))
    i = 0
    while not stop.wait(1 / hz):
        t = session.now()
        recs = [Sample(t, S.SERVER_TOK_PER_S, 120 + rnd.gauss(0, 5)),
                Sample(t, S.LOAD_TOK_PER_S, 118 + rnd.gauss(0, 5)),
                Sample(t, S.SPEC_ACCEPT_LEN, 2.6 + rnd.gauss(0, .1)),
                Sample(t, S.SERVER_ITERATIONS, i * 10.0), Sample(t, S.PHASE_WALL_MS, 12.0)]
        for p, ms, comm in (("draft", 3, 1), ("verify", 5, 1), ("verify_sample", .4, 0),
                            ("draft_extend", 1.2, .4), ("other", .3, 0)):
            recs += [Sample(t, S.phase_ms(p), ms), Sample(t, S.phase_comm_ms(p), comm)]
        recs += [Sample(t, S.accept_pos(k), 0.8 ** k) for k in range(1, 4)]
        for g in range(gpus):
            recs += [Sample(t, S.gpu(g, "sm_active_pct"), 50 + 40 * math.sin(i / 10 + g)),
                     Sample(t, S.gpu(g, "mem_used_mib"), 40e3), Sample(t, S.gpu(g, "mem_total_mib"), 143e3),
                     Sample(t, S.gpu(g, "power_w"), 400.0), Sample(t, S.gpu(g, "power_limit_w"), 700.0),
                     Sample(t, S.gpu(g, "pcie_rx_mbps"), 1e3), Sample(t, S.gpu(g, "pcie_tx_mbps"), 1e2),
                     Sample(t, S.gpu(g, "nvlink_rx_mbps"), 1e4), Sample(t, S.gpu(g, "nvlink_tx_mbps"), 1e4)]
        session.bus.put_many(recs)
        i += 1


async def measure(gpus: int | None, seconds: float, hz: float = 4.0) -> float:
    """CPU seconds per wall second while the app runs; gpus=None means no data at all (idle)."""
    session = Session()
    stop = threading.Event()
    producer = None
    if gpus is not None:
        producer = threading.Thread(target=feed, args=(session, gpus, hz, stop), daemon=True)
        producer.start()
    app = make_app(session, tick_s=1 / hz)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(2.0)                        # warm up: first layout, plot set-up
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    stop.set()
    if producer is not None:
        producer.join()
    return cpu / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    idle = asyncio.run(measure(None, args.seconds))
    one = asyncio.run(measure(1, args.seconds))
    eight = asyncio.run(measure(8, args.seconds))
    print(f"TUI CPU at 4 Hz, {args.seconds:.0f} s each, 120x40 headless (CPU s per wall s of this process)")
    print(f"  idle app, no data      {idle * 100:6.1f} %")
    print(f"  live data, 1 GPU row   {one * 100:6.1f} %   ({one / idle:.1f}x idle)")
    print(f"  live data, 8 GPU rows  {eight * 100:6.1f} %   ({eight / idle:.1f}x idle, {eight / one:.2f}x 1 GPU)")


if __name__ == "__main__":
    main()
