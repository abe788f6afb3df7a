"""One request's parameters cannot end the rank group: a value a tensor or generator cannot hold
fails that request alone (an error update), and the group and the other requests go on.

The HTTP server refuses these at parse time (tests/server/test_bounds.py); these requests reach the
ranks straight through EngineClient, as any other caller of the engine could send them."""

from __future__ import annotations

import threading

import pytest
import torch

from refengine import presets, spec
from refengine.comm import Communicator
from refengine.config import EngineOptions
from refengine.engine import Engine
from refengine.messages import GenRequest, GenUpdate

from .conftest import generate

BAD = [
    dict(temperature=1.0, top_k=2**63),          # the red team's N1: overflowed torch.long in a rank
    dict(temperature=1.0, top_k=-(2**70)),
    dict(temperature=float("nan")),
    dict(temperature=1.0, top_p=float("inf")),
    dict(stop_token_ids=[2**64]),
    dict(seed=2**64),
    dict(seed=-1),
    dict(max_new_tokens=2**80),
]


def _submit(client, rid: str, ids: list[int], **kw) -> tuple[threading.Event, list[GenUpdate]]:
    done, finals = threading.Event(), []

    def cb(u: GenUpdate) -> None:
        if u.finished:
            finals.append(u)
            done.set()
    client.submit(GenRequest(rid, ids, **{"max_new_tokens": 8, **kw}), cb)
    return done, finals


@pytest.mark.parametrize("kw", BAD, ids=[f"{list(k)[-1]}-{i}" for i, k in enumerate(BAD)])
def test_bad_parameters_fail_the_request_not_the_group(pool2, kw):
    # A long request is running while the bad one arrives: it must finish whole.
    long_done, long_finals = _submit(pool2, f"long-{id(kw)}", [2, 40, 6], max_new_tokens=40, ignore_eos=True)
    done, finals = _submit(pool2, f"bad-{id(kw)}", [10, 12, 14], **kw)
    assert done.wait(60), "the bad request got no final update"
    assert finals[0].finish_reason == "error" and finals[0].error, finals[0]
    assert long_done.wait(120) and long_finals[0].finish_reason == "length", long_finals[0]
    assert pool2.alive(), pool2.death_message
    # The group still serves.
    run = generate(pool2, [[90, 7, 3, 1]], 4)
    assert run.finals[0].finish_reason in ("length", "stop")


def test_out_of_vocabulary_prompt_fails_alone(pool2):
    done, finals = _submit(pool2, "oov", [1, 10**6])
    assert done.wait(60) and finals[0].finish_reason == "error" and "input_ids" in finals[0].error
    assert pool2.alive(), pool2.death_message


def test_a_sampling_failure_frees_the_row(monkeypatch):
    """A failure while sampling the first token fails that request and frees its row (in
    process, TP1: the failure is injected into the sampler)."""
    torch.set_num_threads(1)
    e = Engine(EngineOptions(max_running_requests=2, context_length=128), Communicator(0, 1),
               presets.build_target("tiny-agreeing"), presets.build_head("tiny-agreeing-eagle3"),
               torch.device("cpu"), torch.float64)
    free = sorted(e.free_rows)

    def broken(*a, **k):
        raise RuntimeError("invalid multinomial distribution")
    monkeypatch.setattr(spec, "sampling_probs", broken)
    u = e.add_request(GenRequest("s", [2, 40, 6], max_new_tokens=4, temperature=1.0))
    assert u is not None and u.finish_reason == "error" and "RuntimeError" in u.error
    assert sorted(e.free_rows) == free and "s" not in e.reqs
    monkeypatch.undo()
    assert e.add_request(GenRequest("g", [2, 40, 6], max_new_tokens=4)) is None
