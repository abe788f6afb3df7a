"""One request's parameters cannot end the rank group: a value a tensor or generator cannot hold
fails that request alone (an error update), and the group and the other requests go on; so does a
failure in a request's verify_sample work (tests/server/test_decode_fault.py: over real HTTP).

The HTTP server refuses these at parse time (tests/server/test_bounds.py); these requests reach the
ranks straight through EngineClient, as any other caller of the engine could send them."""

from __future__ import annotations

import threading

import pytest
import torch

from refengine import presets, spec
from refengine.comm import Communicator
from refengine.config import EngineOptions
from refengine.engine import FAULT_ENV, Engine
from refengine.messages import GenRequest, GenUpdate
from refengine.rank import lockstep_error

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


# ----- a failure in decode (verify_sample) fails its request alone --------------------------------

def _engine(**kw) -> Engine:
    torch.set_num_threads(1)
    return Engine(EngineOptions(max_running_requests=3, context_length=128, **kw), Communicator(0, 1),
                  presets.build_target("tiny"), presets.build_head("tiny-eagle3"), torch.device("cpu"), torch.float64)


def _decode(e: Engine, rids: list[str], temperature: float) -> tuple[dict[str, list[int]], dict[str, GenUpdate]]:
    for rid in rids:
        assert e.add_request(GenRequest(rid, [2, 40, 6], max_new_tokens=12, temperature=temperature,
                                        ignore_eos=True)) is None
    tokens: dict[str, list[int]] = {}
    finals: dict[str, GenUpdate] = {}
    while e.busy:
        for u in e.step()[0]:
            tokens.setdefault(u.rid, []).extend(u.token_ids)
            if u.finished:
                finals[u.rid] = u
    return tokens, finals


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_verify_sample_failure_fails_that_request_alone(monkeypatch, overlap, temperature):
    monkeypatch.setenv(FAULT_ENV, "doomed")
    e = _engine(disable_overlap_schedule=not overlap)
    free = sorted(e.free_rows)
    tokens, finals = _decode(e, ["a", "doomed-1", "c"], temperature)
    bad = finals["doomed-1"]
    assert bad.finish_reason == "error" and "verify_sample failed: RuntimeError: injected fault" in bad.error
    assert tokens["doomed-1"] == [], "a failed request's tokens are dropped"
    assert sorted(e.free_rows) == free and not e.reqs
    # The requests beside it decode exactly as they do without it (same coins, same decisions).
    plain, _ = _decode(_engine(disable_overlap_schedule=not overlap), ["a", "fine-1", "c"], temperature)
    assert [finals[r].finish_reason for r in ("a", "c")] == ["length", "length"]
    assert tokens["a"] == plain["a"] and tokens["c"] == plain["c"] and len(plain["a"]) == 12


def test_a_failure_no_single_row_has_still_ends_the_rank(monkeypatch):
    """Isolation keeps only a failure a request has alone: one of the batch as a whole is the
    engine's, and is raised (the rank reports it and the group ends, as before)."""
    e = _engine()
    real = spec.sampling_probs

    def batch_only(logits, *a, **k):
        if logits.shape[0] > 1:
            raise RuntimeError("a batch-wide failure")
        return real(logits, *a, **k)
    monkeypatch.setattr(spec, "sampling_probs", batch_only)
    with pytest.raises(RuntimeError, match="a batch-wide failure"):
        _decode(e, ["a", "b"], 1.0)


def test_ranks_that_failed_different_requests_are_out_of_lockstep():
    assert lockstep_error(1, ["x", "y"], ["y", "x"]) is None
    assert lockstep_error(1, [], []) is None
    why = lockstep_error(1, ["x"], [])
    assert "out of lock-step" in why and "rank 0 ['x']" in why and "rank 1 []" in why
