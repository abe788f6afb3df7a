"""Batched and chunked prefill (Engine.add_requests, SGLang 0.5.23's PrefillAdder): the waiting
requests are prefilled in one target forward and one draft prefill-extend, a prompt longer than
--chunked-prefill-size in chunks, and greedy outputs equal one-at-a-time prefill on TP1 and TP2.

The TP1 engine runs in process on a random-weight target (every token depends on its whole
context, so a K/V slip in a padded or chunked row changes the output); TP2 runs on real gloo ranks.
"""

from __future__ import annotations

import pytest
import torch

from refengine import presets
from refengine.comm import Communicator
from refengine.config import EngineOptions, SpecConfig
from refengine.engine import Engine
from refengine.messages import GenRequest

from .conftest import _start, generate

torch.set_num_threads(1)

# Lengths chosen so batches pad (3..11 tokens) and chunks of 4 split prompts mid-way.
PROMPTS = [[2, 40, 6], [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30], [90, 7, 3, 1, 5], [33, 44, 55, 66, 77, 88, 99]]


def _engine(dtype=torch.float32, **kw) -> Engine:
    target = presets.build_target("tiny")
    head = presets.build_head("tiny-eagle3")
    opts = EngineOptions(max_running_requests=4, context_length=128, **kw)
    e = Engine(opts, Communicator(0, 1), target, head, torch.device("cpu"), dtype)
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    return e


def _count_forwards(e: Engine) -> list[int]:
    """Batch sizes of the engine's prefill forwards, recorded as they run."""
    sizes: list[int] = []
    real = e._prefill_forward

    def counted(reqs, starts, lens, rows):
        sizes.append(len(reqs))
        return real(reqs, starts, lens, rows)
    e._prefill_forward = counted
    return sizes


def _run(e: Engine, prompts, together: bool, max_new: int = 16) -> list[list[int]]:
    toks: dict[str, list[int]] = {}

    def keep(updates):
        for u in updates:
            assert u.finish_reason != "error", u.error
            toks.setdefault(u.rid, []).extend(u.token_ids)

    reqs = [GenRequest(f"r{i}", list(p), max_new_tokens=max_new, ignore_eos=True) for i, p in enumerate(prompts)]
    if together:
        keep(e.add_requests(reqs))
    else:
        for r in reqs:        # each request prefilled alone and run to the end before the next
            keep(e.add_requests([r]))
            while e.busy:
                keep(e.step()[0])
    while e.busy:
        keep(e.step()[0])
    return [toks[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("graph", ["off", "static"])
def test_waiting_requests_are_prefilled_in_one_forward_with_the_same_greedy_output(graph):
    """graph "static": the CPU stand-in of CUDA graphs, so rows are padded to the width bucket and
    the batch to its graph bucket (pad rows on the spare KV row)."""
    alone = _run(_engine(cuda_graph=graph), PROMPTS, together=False)
    e = _engine(cuda_graph=graph)
    sizes = _count_forwards(e)
    together = _run(e, PROMPTS, together=True)
    assert sizes == [4], "the four waiting requests were not one prefill batch"
    assert together == alone
    assert len({t for row in alone for t in row}) > 10


@pytest.mark.parametrize("overlap", [False, True])
def test_chunked_prefill_splits_long_prompts_and_keeps_the_output(overlap):
    """--chunked-prefill-size 4: the chunked request's next chunk first, then the waiting ones in
    order, at most 4 prompt tokens a batch; the remaining chunks run in the following steps."""
    alone = _run(_engine(disable_overlap_schedule=not overlap), PROMPTS, together=False)
    e = _engine(chunked_prefill_size=4, disable_overlap_schedule=not overlap)
    plan = []
    real = e._prefill_forward

    def seen(reqs, starts, lens, rows):
        plan.append([(r.rid, s, n) for r, s, n in zip(reqs, starts, lens)])
        return real(reqs, starts, lens, rows)
    e._prefill_forward = seen
    together = _run(e, PROMPTS, together=True)
    assert together == alone
    assert plan[:4] == [[("r0", 0, 3), ("r1", 0, 1)], [("r1", 1, 4)], [("r1", 5, 4)], [("r1", 9, 2), ("r2", 0, 2)]]
    assert all(sum(n for _, _, n in batch) <= 4 for batch in plan)
    covered: dict[str, int] = {}
    for batch in plan:
        for rid, s, n in batch:
            assert s == covered.get(rid, 0), "a chunk did not start where the last one ended"
            covered[rid] = s + n
    assert covered == {f"r{i}": len(p) for i, p in enumerate(PROMPTS)}


def test_max_prefill_tokens_leaves_the_rest_waiting():
    """Without chunking the first request may exceed --max-prefill-tokens; the next stops at it
    (schedule_policy.py:1627-1633) and is prefilled in the next step."""
    e = _engine(chunked_prefill_size=-1, max_prefill_tokens=8)
    sizes = _count_forwards(e)
    assert _run(e, PROMPTS, together=True) == _run(_engine(), PROMPTS, together=False)
    assert sizes[0] == 1 and sum(sizes) == 4


def test_one_at_a_time_switch_is_the_engine_before_batching(monkeypatch):
    """$SPECDECODE_PREFILL_ONE_AT_A_TIME=1 (benchmarks/prefill_ttft.py's "before" arm): every waiting
    request in its own forward, all in the same call, and the same greedy output."""
    monkeypatch.setenv("SPECDECODE_PREFILL_ONE_AT_A_TIME", "1")
    e = _engine()
    sizes = _count_forwards(e)
    got = _run(e, PROMPTS, together=True)
    monkeypatch.delenv("SPECDECODE_PREFILL_ONE_AT_A_TIME")
    assert sizes == [1, 1, 1, 1] and got == _run(_engine(), PROMPTS, together=False)


def test_an_abort_while_waiting_frees_the_row():
    e = _engine(chunked_prefill_size=4)
    free = len(e.free_rows)
    assert e.add_requests([GenRequest("long", list(range(1, 12)), max_new_tokens=4, ignore_eos=True)]) == []
    assert [r.rid for r in e.waiting] == ["long"] and e.reqs["long"].prefilled == 4
    assert e.abort("long").finish_reason == "abort"
    assert not e.waiting and not e.busy and len(e.free_rows) == free


@pytest.fixture(scope="module")
def pool2_chunked():
    """TP2 on the random-weight target with chunks of 4 prompt tokens."""
    c = _start(2, model="tiny", chunked_prefill_size=4)
    yield c
    c.close()


def test_tp2_batched_and_chunked_equal_one_at_a_time(pool2_random, pool2_chunked):
    alone = [generate(pool2_random, [p], 16, config={"speculative_num_steps": 3}).tokens[0] for p in PROMPTS]
    assert generate(pool2_random, PROMPTS, 16).tokens == alone
    run = generate(pool2_chunked, PROMPTS, 16, config={"speculative_num_steps": 3})
    assert run.tokens == alone
