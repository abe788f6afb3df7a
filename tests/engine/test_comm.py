"""The communicator on a real (one-rank) gloo group: counts, bytes, phase labels, emulated
latency, profiler span names."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from refengine.comm import Communicator


@pytest.fixture
def group():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_counts_bytes_and_phases(group):
    c = Communicator(0, 1)
    c.phase = "draft"
    c.all_reduce(torch.ones(4, dtype=torch.float32))
    c.phase = "verify"
    out = c.all_gather(torch.ones(2, 3, dtype=torch.float64), dim=-1)
    c.broadcast(torch.zeros(5, dtype=torch.long))
    assert out.shape == (2, 3)
    assert c.broadcast_object({"a": 1}) == {"a": 1}
    ms, calls, nbytes = c.drain()
    assert calls == {"draft": 1, "verify": 3}
    assert nbytes["draft"] == 16 and nbytes["verify"] == 48 + 40 + 8
    assert set(ms) == {"draft", "verify"} and all(v >= 0 for v in ms.values())
    assert c.drain() == ({}, {}, {})                      # drained
    assert dict(c.totals.by_op) == {"all_reduce": 1, "all_gather": 1, "broadcast": 1, "broadcast_object": 1}


def test_emulated_latency_is_inside_the_timed_span(group):
    c = Communicator(0, 1, latency_us=(20000.0, 1000.0))   # 20 ms + 1 ms per KB
    assert c.emulated
    t0 = time.perf_counter()
    c.all_reduce(torch.ones(256, dtype=torch.float32))      # 1 KB
    wall = (time.perf_counter() - t0) * 1e3
    ms, _, _ = c.drain()
    assert wall >= 21 and ms["other"] >= 21


def test_profiler_span_names(group):
    c = Communicator(0, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        c.all_reduce(torch.ones(4))
        c.all_gather(torch.ones(4))
    names = {e.name for e in prof.events()}
    assert {"specdecode.comm.all_reduce", "specdecode.comm.all_gather"} <= names
