"""Shared pieces of the engine benchmarks (gpu_smoke.py, gpu_scenario.py): a load keeper that holds
a constant batch of running requests, measuring one configuration from the phase stream (capture
iterations excluded), the published acceptance curve, and the H200 reference figures the GPU
numbers are printed next to.

Talks to the engine only through refengine.client.EngineClient. Must not assert on timings:
scripts print measured ratios side by side.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

PHASES = ("draft", "verify", "verify_sample", "draft_extend", "other")

# vLLM, H100, batch 1, Llama-3.1-8B + EAGLE-3, chain of K steps (vllm-project/vllm issue 20780):
# accept length τ for K = 2..7. τ(1) is not published: ALPHA1 is our assumption.
PUBLISHED_TAU = {2: 2.36, 3: 2.79, 4: 3.08, 5: 3.32, 6: 3.46, 7: 3.54}
ALPHA1 = 0.8

# Cost proxy on 2×H200 (batch 1, Llama-3.1-8B shapes, bf16): weight-streaming matmuls plus the
# real NCCL collectives, no attention math; µs per call (the team's H200 measurements, 2026-11-30).
PROXY_US = {
    ("draft_step", "sharded", "nvlink", "graph"): 187.0,
    ("draft_step", "sharded", "nvlink", "eager"): 628.0,
    ("draft_step", "sharded", "slow", "graph"): 453.0,
    ("draft_step", "replicated", "nvlink", "graph"): 236.0,
    ("draft_step", "replicated", "nvlink", "eager"): 248.0,
    ("draft_step", "replicated", "slow", "graph"): 236.0,
    ("verify4", "tp2", "nvlink", "graph"): 2989.0,
    ("verify4", "tp2", "nvlink", "eager"): 9344.0,
    ("verify4", "tp2", "slow", "graph"): 9159.0,
}

# NCCL knobs per interconnect. "slow" disables P2P and shared memory: a stand-in for a PCIe box.
INTERCONNECTS = {"nvlink": {}, "slow": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}}
# On CPU ranks NCCL is not used: "emulated" adds the slow link's measured latency per collective
# (45 µs + 0.36 µs/KB: 45 µs at 8 KB and ~780 µs at 2 MB on the H200 pair), labelled as emulation.
EMULATED_SLOW = "45,0.36"


def published_curve(alpha1: float = ALPHA1) -> tuple[float, ...]:
    """Conditional acceptance α_1..α_7 whose τ(s) = 1 + Σ_{k≤s} Π α reproduces PUBLISHED_TAU."""
    p = {1: alpha1, 2: PUBLISHED_TAU[2] - 1 - alpha1}
    for k in range(3, 8):
        p[k] = PUBLISHED_TAU[k] - PUBLISHED_TAU[k - 1]
    return tuple(round(p[k] / p[k - 1] if k > 1 else p[1], 4) for k in range(1, 8))


# EAGLE-3 paper (arXiv:2503.01840v3, Table 1), LLaMA-Instruct 3.1 8B, temperature 1: accept length τ
# 4.24 on MT-bench and 5.82 on HumanEval, with draft trees 8 deep. A workload is simulated as the one
# conditional acceptance α per position that makes an 8-deep chain accept that τ (our assumption: the
# paper publishes no chain curve per benchmark; a chain accepts less than a tree, so these are high).
PAPER_TAU_T1 = {"mtbench": 4.24, "humaneval": 5.82}
PAPER_DEPTH = 8


def workload_curve(name: str, positions: int = 7) -> tuple[float, ...]:
    """The simulated curve of a published workload (PAPER_TAU_T1's names): α repeated per position."""
    target, lo, hi = PAPER_TAU_T1[name], 0.0, 1.0
    for _ in range(60):   # τ(α) = Σ_{i ≤ depth} α^i rises with α: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(PAPER_DEPTH + 1)) < target else (lo, mid)
    return (round(hi, 4),) * positions


def curve_tau(curve: tuple[float, ...], steps: int) -> float:
    tau, prod = 1.0, 1.0
    for k in range(steps):
        prod *= curve[min(k, len(curve) - 1)]
        tau += prod
    return tau


def describe_gpus(device: str, report: dict) -> None:
    """Put the GPU names into `report["gpus"]` and print them with torch's and NCCL's versions."""
    try:
        import torch
        if device == "cuda" and torch.cuda.is_available():
            report["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            print(f"# GPUs: {report['gpus']}; torch {torch.__version__}; NCCL {torch.cuda.nccl.version()}")
    except Exception as e:  # a report without GPU names is still a report
        print(f"# (no GPU description: {e})")


def base_env() -> dict[str, str]:
    """Keep NVLink multicast off in every rank unless the caller's environment says otherwise."""
    import os

    return {"NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}


class Load:
    """Keeps `batch` requests running (a finished one is replaced at once), so measured
    iterations have a constant batch. Prompts are random ids (fixed seed)."""

    _instances = 0

    def __init__(self, client, vocab: int, batch: int, prompt_len: int = 16, max_new: int = 1024,
                 seed: int = 0, temperature: float = 0.0):
        from refengine.client import GenRequest

        self.client, self.batch, self.max_new = client, batch, max_new
        self.GenRequest, self.temperature = GenRequest, temperature
        rng = random.Random(seed)
        self.prompts = [[rng.randrange(1, vocab - 1) for _ in range(prompt_len)] for _ in range(batch)]
        Load._instances += 1
        self.tag = f"load{Load._instances}"          # rids stay unique across Load objects
        self.n, self.errors, self.stopped = 0, [], False
        self.active: dict[int, str] = {}
        self.lock = threading.Lock()

    def start(self) -> None:
        for i in range(self.batch):
            self._submit(i)

    def _submit(self, i: int) -> None:
        with self.lock:
            if self.stopped:
                return
            self.n += 1
            rid = self.active[i] = f"{self.tag}-{i}-{self.n}"
        self.client.submit(self.GenRequest(rid, self.prompts[i], max_new_tokens=self.max_new, ignore_eos=True,
                                           temperature=self.temperature), lambda u, i=i: self._update(i, u))

    def _update(self, i: int, u) -> None:
        if u.finished:
            if u.finish_reason == "error":
                self.errors.append(u.error)
            elif not self.stopped:
                self._submit(i)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            rids = list(self.active.values())
        for rid in rids:
            self.client.abort(rid)


@dataclass
class Measured:
    config: dict[str, Any]
    batch: int
    records: list[dict] = field(default_factory=list)
    captures: int = 0
    timed_out: bool = False

    def median(self, key: str, phase: str) -> float:
        vals = [r[key][phase] for r in self.records if phase in r.get(key, {})]
        return statistics.median(vals) if vals else math.nan

    @property
    def steps(self) -> int:
        return self.records[-1]["steps"] if self.records else self.config.get("speculative_num_steps", 0)

    def tok_per_s(self) -> float:
        wall = sum(r["wall_ms"] for r in self.records)
        return sum(r["committed"] for r in self.records) / wall * 1e3 if wall else math.nan

    def tau(self) -> float:
        n = sum(r["bs"] for r in self.records)
        return sum(r["committed"] for r in self.records) / n if n else math.nan

    def draft_step_ms(self) -> float:
        """Draft phase per draft forward (chain: steps - 1 forwards per iteration)."""
        s = self.steps
        return self.median("phase_ms", "draft") / (s - 1) if s > 1 else math.nan

    def calls(self, phase: str, key: str = "comm_calls") -> int:
        return self.records[-1].get(key, {}).get(phase, 0) if self.records else 0

    def summary(self) -> dict[str, Any]:
        return {"config": self.config, "batch": self.batch, "iterations": len(self.records),
                "captures_skipped": self.captures, "timed_out": self.timed_out,
                "tok_per_s": self.tok_per_s(), "tau": self.tau(), "wall_ms": self.median_wall(),
                "phase_ms": {p: self.median("phase_ms", p) for p in PHASES},
                "comm_ms": {p: self.median("comm_ms", p) for p in PHASES},
                "comm_calls": {p: self.calls(p) for p in PHASES},
                "comm_calls_in_graph": {p: self.calls(p, "comm_calls_in_graph") for p in PHASES},
                "draft_step_ms": self.draft_step_ms()}

    def median_wall(self) -> float:
        return statistics.median(r["wall_ms"] for r in self.records) if self.records else math.nan


def measure(client, config: dict[str, Any], batch: int, iterations: int, settle: int = 3,
            timeout_s: float = 120.0) -> Measured:
    """Apply `config` live (a running Load keeps the batch), skip `settle` iterations of the new
    epoch and every iteration that captured a graph, then collect `iterations` with bs == batch."""
    seq, _ = client.phase_records(0, 1 << 30)
    epoch = client.set_config(config)["epoch"] if config else client.active_config()["epoch"]
    m = Measured(config=config, batch=batch)
    seen = 0
    deadline = time.monotonic() + timeout_s
    while len(m.records) < iterations:
        if time.monotonic() > deadline:
            m.timed_out = True
            break
        seq, recs = client.phase_records(seq, 1 << 30)
        for r in recs:
            if r["epoch"] != epoch:
                continue
            seen += 1
            if r.get("capture"):
                m.captures += 1
                continue
            if seen <= settle or r["bs"] != batch:
                continue
            m.records.append(r)
        if not recs:
            time.sleep(0.01)
    m.records = m.records[:iterations]
    return m


def fmt(v: float, spec: str = "{:.2f}") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def graph_keys(client) -> list[dict]:
    """Every rank's graph keys with their mean replay time (needs cuda_graph_timing)."""
    out = []
    for rank, st in sorted(client.stats()["per_rank"].items()):
        for k in (st.get("graphs") or {}).get("keys", []):
            out.append({"rank": rank, **k})
    return out
