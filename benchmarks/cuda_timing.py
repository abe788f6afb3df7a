"""One way to time GPU work in the benchmarks: `fn` captured as a CUDA graph and replayed, CUDA
events around each replay, the median in µs (on CPU: plain calls, perf_counter). Used wherever a
benchmark prints µs of a kernel or a forward next to an anchor measured the same way."""

from __future__ import annotations

import statistics
import time


def graph_us(fn, reps: int = 100, device: str = "cuda", skip: int = 5) -> float:
    import torch

    if device != "cuda":
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e6)
        return statistics.median(out)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):      # warm-up outside the graph (cuBLAS handles, Triton compiles)
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out[min(skip, reps - 1):])
