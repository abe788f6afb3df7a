"""The rank process model: a killed rank ends the group with a message within seconds, start
failures say why, close() leaves no child, and torch.profiler traces come from every rank."""

from __future__ import annotations

import gzip
import json
import os
import signal
import threading

import pytest

from harness import wait_until
from refengine.client import EngineClient, EngineOptions, EngineStartError, GenRequest

from .conftest import PROMPTS, generate


def _opts(**kw) -> EngineOptions:
    base = dict(model_path="tiny-agreeing", load_format="dummy", tp_size=2, threads_per_rank=1,
                init_timeout_s=30, context_length=256, max_running_requests=4)
    base.update(kw)
    return EngineOptions(**base)


@pytest.mark.slow
def test_killed_rank_ends_group_with_message():
    client = EngineClient.start(_opts())
    try:
        finals, tokens = [], []
        got = threading.Event()

        def cb(u):
            tokens.extend(u.token_ids)
            if u.finished:
                finals.append(u)
                got.set()

        # A long request is running when the rank dies: it must end with the reason.
        client.submit(GenRequest("long", [2, 40, 6], max_new_tokens=200, ignore_eos=True), cb)
        pid = client.rank_info()[1]["pid"]
        wait_until(lambda: tokens, 60, "the long request's first tokens")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not client.alive(), 30, "the group to notice the dead rank")
        assert "TP rank 1" in client.death_message and "died" in client.death_message
        assert got.wait(30) and finals[0].finish_reason == "error" and "rank 1" in finals[0].error
        assert len(tokens) < 200, "the request finished before the rank died: nothing was tested"
        wait_until(lambda: not any(p.is_alive() for p in client._procs), 30, "every rank of the group to end")
    finally:
        client.close()


def test_start_failure_says_why(tmp_path):
    with pytest.raises(EngineStartError, match="config.json: missing"):
        EngineClient.start(_opts(model_path=str(tmp_path / "nowhere"), load_format="auto", tp_size=1,
                                 speculative_draft_model_path="tiny-agreeing-eagle3"))


def test_close_leaves_no_child_process():
    client = EngineClient.start(_opts(tp_size=1))
    procs = list(client._procs)
    client.close()
    assert all(not p.is_alive() for p in procs)
    assert not client.alive()


def test_profile_writes_one_trace_per_rank_with_span_names(pool2, tmp_path):
    pool2.set_config({"speculative_num_steps": 3, "speculative_draft_placement": "sharded"})
    pool2.start_profile(str(tmp_path), activities=["CPU"], profile_id="p1")
    generate(pool2, PROMPTS[:2], 8)
    paths = pool2.stop_profile()
    assert sorted(os.path.basename(p) for p in paths) == ["p1-TP-0.trace.json.gz", "p1-TP-1.trace.json.gz"]
    for p in paths:
        names = {e.get("name") for e in json.load(gzip.open(p))["traceEvents"]}
        assert {"draft", "draft_extend", "specdecode.verify_sample", "specdecode.comm.all_reduce",
                "specdecode.comm.all_gather", "specdecode.comm.broadcast"} <= names
        assert any(n and n.startswith("step[VERIFY bs=") for n in names)
        assert any(n and n.startswith("step[DRAFT bs=") for n in names)


def test_profile_num_steps_stops_by_itself(pool1, tmp_path):
    pool1.start_profile(str(tmp_path), num_steps=3, activities=["CPU"], profile_id="auto")
    generate(pool1, PROMPTS[:1], 12)
    assert [os.path.basename(p) for p in pool1.stop_profile()] == ["auto-TP-0.trace.json.gz"]


def test_rank_info_and_stats(pool2):
    info = pool2.rank_info()
    assert [r["tp_rank"] for r in info] == [0, 1] and all(r["pid"] > 0 for r in info)
    generate(pool2, PROMPTS[:1], 8, config={"speculative_num_steps": 2})
    # Rank totals arrive every 0.25 s: wait until both ranks reported verify time.
    s = wait_until(lambda: (st := pool2.stats())["per_rank"].get(1, {}).get("phase_seconds", {}).get("verify", 0) > 0
                   and set(st["per_rank"]) == {0, 1} and st, 60, "both ranks' totals")
    assert s["generation_tokens_total"] > 0 and s["spec_verify_ct_total"] > 0
    assert set(s["per_rank"]) == {0, 1}
    assert s["per_rank"][1]["phase_seconds"]["verify"] > 0
    assert s["accept_position_total"].get(1, 0) <= s["spec_verify_ct_total"]


def test_live_request_id_is_never_rebound(pool1):
    """A second submit under a live id is refused at once; the first request still gets every
    update (before, the second callback replaced the first and the first waited forever)."""
    first_done, got = threading.Event(), []

    def first(u):
        got.append(u)
        if u.finished:
            first_done.set()

    pool1.submit(GenRequest("same", list(PROMPTS[0]), max_new_tokens=40, ignore_eos=True), first)
    second = []
    pool1.submit(GenRequest("same", list(PROMPTS[1]), max_new_tokens=4), second.append)
    assert len(second) == 1 and second[0].finished and second[0].finish_reason == "error"
    assert second[0].error == "Duplicate request ID detected: same"
    assert first_done.wait(120) and got[-1].finish_reason == "length"
    assert sum(len(u.token_ids) for u in got) == 40 and pool1.live_requests() == 0


@pytest.mark.parametrize("steps", [0, 3])
def test_verify_counters_count_kept_results_only(pool1, steps):
    """Overlapped, a request finished by a stop token runs one more iteration whose result is
    dropped (`bs` counts its row, `accepted` does not): the engine's verify counter must equal the
    sum of the requests' own spec_verify_ct."""
    plain = generate(pool1, PROMPTS[:1], 16, config={"speculative_num_steps": 3}).tokens[0]
    before = pool1.stats()["spec_verify_ct_total"]
    run = generate(pool1, PROMPTS, 16, config={"speculative_num_steps": steps}, stop_token_ids=[plain[6]])
    after = pool1.stats()["spec_verify_ct_total"]
    assert run.finals[0].finish_reason == "stop"
    assert any(r.get("dropped") for r in run.records), "no dropped row: the test shows nothing"
    assert after - before == sum(f.spec.spec_verify_ct for f in run.finals)


def test_one_iterations_updates_travel_in_one_message(pool1, monkeypatch):
    """Rank 0 sends each iteration's updates as one message (SGLang's one BatchTokenIDOut per
    iteration): a message per request per iteration was the server's limit at batch 64 on the
    H200 (benchmarks/results/closed_loop_waves_h200.md). Every token still reaches its request, in
    order."""
    from refengine.messages import Updates

    sizes: list[int] = []
    dispatch = pool1._dispatch

    def counting(item):
        if isinstance(item, Updates):
            sizes.append(len(item.updates))
        dispatch(item)
    monkeypatch.setattr(pool1, "_dispatch", counting)
    n = len(PROMPTS)
    assert n >= 3
    run = generate(pool1, PROMPTS, 12, config={"speculative_num_steps": 0}, ignore_eos=True)
    assert all(len(t) == 12 for t in run.tokens) and all(f.finish_reason == "length" for f in run.finals)
    # Steps 0 commits one token per request per iteration: n requests, n updates a message.
    assert max(sizes) == n and sum(sizes) >= n * 11
    assert len(sizes) < sum(sizes) / 2


def test_a_failing_callback_costs_only_its_own_request(pool1):
    """Updates of one iteration travel together: a callback that raises must not keep the
    others in the same message from theirs (their final update would never come)."""
    done, got = threading.Event(), []

    def bad(u):
        raise RuntimeError("a client handler failed")

    def good(u):
        got.append(u)
        if u.finished:
            done.set()
    pool1.submit(GenRequest("bad-cb", list(PROMPTS[0]), max_new_tokens=12, ignore_eos=True), bad)
    pool1.submit(GenRequest("good-cb", list(PROMPTS[1]), max_new_tokens=12, ignore_eos=True), good)
    assert done.wait(120) and got[-1].finish_reason == "length"
    assert sum(len(u.token_ids) for u in got) == 12
    wait_until(lambda: pool1.live_requests() == 0, 60, "both requests finished in the engine")
