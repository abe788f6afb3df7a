"""A small real TP2 torch program on CPU that writes per-rank profiler traces shaped like the engine's.

Run: `python cpu_trace_program.py OUT_DIR ITERATIONS`. Two processes join a real gloo group; each
decode "iteration" runs the engine's phase spans (`draft` with `step[DRAFT bs=1]` forwards,
`specdecode.verify`, `specdecode.verify_sample`, `draft_extend`) with matmuls and all-reduces inside
`specdecode.comm.all_reduce` spans. Every rank writes `cpu-TP-{rank}.trace.json` and its own phase
timers (perf_counter around each phase, as an engine would keep them) to `timers-{rank}.json`.
Used by tests/probes/test_trace_cpu.py; it is a test program, not a fake of the engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager


def rank_main(rank: int, port: int, out: str, iterations: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    w = torch.randn(96, 96)
    x = torch.randn(4, 96)
    timers: list[dict[str, float]] = []

    def comm(t):
        with record_function("specdecode.comm.all_reduce"):
            dist.all_reduce(t)
        return t

    def forward(h, layers):
        for _ in range(layers):
            h = torch.tanh(h @ w)
            h = comm(h)
        return h

    @contextmanager
    def phase(name: str, times: dict[str, float]):
        t0 = time.perf_counter()
        with record_function(name):
            yield
        times[name] = times.get(name, 0.0) + (time.perf_counter() - t0) * 1000.0

    forward(x, 2)  # warm up gloo before profiling
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iterations):
            times: dict[str, float] = {}
            with phase("draft", times):
                h = x
                for _ in range(3):
                    with record_function("step[DRAFT bs=1]"):
                        h = forward(h, 1)
            with phase("specdecode.verify", times):
                h = forward(h, 4)
            with phase("specdecode.verify_sample", times):
                h = torch.softmax(h, dim=-1).argmax(dim=-1)
                # rank 1 is slower at sampling: the other rank waits for it in the next collective.
                # Its extra work (tens of ms of sorting per iteration) is far above what a busy
                # machine's preemption adds to rank 0's few ms of ops, so "slowest" cannot flip.
                n = 1 << 16 if rank == 1 else 256
                for _ in range(4 if rank == 1 else 1):
                    torch.sort(torch.randn(n))
            with phase("draft_extend", times):
                h = forward(x, 2)
            timers.append(times)
    prof.export_chrome_trace(os.path.join(out, f"cpu-TP-{rank}.trace.json"))
    with open(os.path.join(out, f"timers-{rank}.json"), "w") as f:
        json.dump(timers, f)
    dist.destroy_process_group()


def main() -> None:
    import socket

    import torch.multiprocessing as mp

    out, iterations = sys.argv[1], int(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, out, iterations), nprocs=2, join=True)


if __name__ == "__main__":
    main()
