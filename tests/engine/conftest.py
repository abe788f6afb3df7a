"""Shared engine fixtures: session-scoped rank pools (the gloo ranks start once per session) and a
helper that generates a batch to completion and returns tokens, final updates and phase records."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from refengine.client import EngineClient, EngineOptions, GenRequest, GenUpdate

PROMPTS = [[2, 40, 6], [10, 12, 14, 16, 18], [90, 7, 3, 1]]


def _start(tp: int, model: str = "tiny-agreeing", **kw) -> EngineClient:
    opts = EngineOptions(model_path=model, load_format="dummy", tp_size=tp, dtype="float64",
                         speculative_num_steps=3, max_running_requests=4, context_length=256,
                         threads_per_rank=1, init_timeout_s=30, **kw)
    return EngineClient.start(opts)


@pytest.fixture(scope="session")
def pool1():
    c = _start(1)
    yield c
    c.close()


@pytest.fixture(scope="session")
def pool2():
    """TP2; topk = 1 sampling uses chain rejection sampling here (target-only at TP1)."""
    c = _start(2, speculative_use_rejection_sampling=True)
    yield c
    c.close()


@pytest.fixture(scope="session")
def pool2_random():
    """TP2 on random weights: a target whose every token depends on its context (τ ≈ 1)."""
    c = _start(2, model="tiny")
    yield c
    c.close()


@dataclass
class Run:
    tokens: list[list[int]]
    finals: list[GenUpdate]
    records: list[dict]

    def tau(self) -> float:
        """Committed tokens per request-verify over the run's speculative iterations."""
        recs = [r for r in self.records if r["steps"] > 0]
        return sum(r["committed"] for r in recs) / max(1, sum(r["bs"] for r in recs))


_counter = [0]


def generate(client: EngineClient, prompts=PROMPTS, max_new: int = 24, config: dict | None = None,
             switches: list[tuple[int, dict]] = (), timeout: float = 120.0, **req_kw) -> Run:
    """Generate `prompts` together; `switches` = [(after n tokens of request 0, changes), ...]."""
    if config:
        client.set_config(config)
    seq, _ = client.phase_records(0, 1 << 30)
    toks = [[] for _ in prompts]
    finals: list[GenUpdate | None] = [None] * len(prompts)
    cond = threading.Condition()

    def cb_for(i):
        def cb(u: GenUpdate):
            with cond:
                toks[i].extend(u.token_ids)
                if u.finished:
                    finals[i] = u
                cond.notify_all()
        return cb

    _counter[0] += 1
    for i, p in enumerate(prompts):
        client.submit(GenRequest(f"t{_counter[0]}-{i}", list(p), max_new_tokens=max_new, **req_kw), cb_for(i))
    for after, changes in switches:
        with cond:
            assert cond.wait_for(lambda: len(toks[0]) >= after or all(finals), timeout)
        client.set_config(changes)
        # One more token for request 0 = one iteration ran under the new config.
        with cond:
            n = len(toks[0])
            cond.wait_for(lambda: len(toks[0]) > n or finals[0] is not None, timeout)
    with cond:
        assert cond.wait_for(lambda: all(finals), timeout), "generation did not finish"
    _, recs = client.phase_records(seq, 1 << 30)
    return Run(toks, finals, recs)
