"""KV invariants inside one engine (TP1, in process, float64): after every iteration (steps 0, SGLang's
tier 0, included) the target and draft KV lengths equal the committed length, and their contents equal a fresh recomputation
over the committed tokens, so compaction and positions are right, not just the bookkeeping."""

from __future__ import annotations

import pytest
import torch

from refengine import presets
from refengine.comm import Communicator
from refengine.config import EngineOptions, SpecConfig
from refengine.engine import Engine
from refengine.messages import GenRequest
from refengine.models.layers import causal_meta

torch.set_num_threads(1)


def _engine(overlap: bool = False) -> Engine:
    """Without overlap by default: the KV checks read the pools after each iteration's own writes
    (overlapped, the next iteration has already written its drafts there)."""
    target = presets.build_target("tiny-agreeing")
    head = presets.build_head("tiny-agreeing-eagle3")
    opts = EngineOptions(max_running_requests=3, context_length=128, disable_overlap_schedule=not overlap)
    return Engine(opts, Communicator(0, 1), target, head, torch.device("cpu"), torch.float64)


def _check_kv(e: Engine) -> None:
    ref_t = presets.build_target("tiny-agreeing").double()
    ref_h = presets.build_head("tiny-agreeing-eagle3").double()
    ref_h.set_embed(ref_t.model.embed_tokens)
    for r in e.reqs.values():
        n = r.seq_len
        assert n == len(r.tokens) - 1, "target KV holds every committed token but the root"
        ids = torch.tensor([r.tokens[:n]])
        meta = causal_meta(torch.tensor([0]), torch.arange(n)[None], n)
        kv = ref_t.make_kv(1, n, torch.float64, "cpu")
        with torch.no_grad():
            _, aux = ref_t(ids, meta, kv)
            for layer in range(len(kv.k)):
                torch.testing.assert_close(e.kv.k[layer][r.row, :n], kv.k[layer][0], rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(e.kv.v[layer][r.row, :n], kv.v[layer][0], rtol=1e-9, atol=1e-9)
            dkv = ref_h.make_kv(1, n, torch.float64, "cpu")
            ref_h(torch.tensor([r.tokens[1:n + 1]]), aux, meta, dkv)
            torch.testing.assert_close(e.draft.kv.k[0][r.row, :n], dkv.k[0][0], rtol=1e-9, atol=1e-9)


def test_kv_equals_recomputation_after_every_iteration():
    e = _engine()
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    for i, p in enumerate([[2, 40, 6], [10, 12, 14, 16, 18], [90, 7, 3]]):
        e.add_request(GenRequest(f"r{i}", p, max_new_tokens=40, ignore_eos=True))
    accepted_multi = False
    plan = {3: SpecConfig(steps=5, num_draft_tokens=6, epoch=2), 6: SpecConfig(steps=0, num_draft_tokens=1, epoch=3),
            8: SpecConfig(steps=2, num_draft_tokens=3, epoch=4),
            # trees: accepted nodes' K/V must be compacted to the front of the window
            11: SpecConfig(steps=3, topk=4, num_draft_tokens=8, epoch=5),
            14: SpecConfig(steps=4, topk=2, num_draft_tokens=8, epoch=6)}
    for it in range(18):
        if it in plan:
            e.apply_config(plan[it])
        _, rec = e.step()
        accepted_multi |= any(a >= 2 for a in rec["accepted"])
        # Every iteration, steps 0 included: tier 0 extends the draft too (SGLang's), so the
        # draft KV never lags the target's.
        assert rec["steps"] > 0 or rec["phase_ms"]["draft_extend"] > 0
        _check_kv(e)
    assert accepted_multi, "no cycle accepted two drafts: the checkpoint does not agree"


@pytest.mark.parametrize("overlap", [False, True])
def test_stops_truncate_after_eos_and_budget(overlap):
    e = _engine(overlap)
    e.apply_config(SpecConfig(steps=5, num_draft_tokens=6, epoch=1))
    plain = _engine(overlap)
    plain.apply_config(SpecConfig(steps=0, num_draft_tokens=1, epoch=1))
    outs = {}
    for eng, tag in ((plain, "plain"), (e, "spec")):
        assert eng.add_request(GenRequest("x", [2, 40, 6], max_new_tokens=30, ignore_eos=True)) is None
        toks = []
        while eng.reqs:
            ups, _ = eng.step()
            toks += [t for u in ups for t in u.token_ids]
        outs[tag] = toks
    assert outs["plain"] == outs["spec"] and len(outs["spec"]) == 30
    stop = outs["plain"][7]
    for eng in (plain, e):
        assert eng.add_request(GenRequest("y", [2, 40, 6], max_new_tokens=30, stop_token_ids=[stop])) is None
        toks, final = [], None
        while eng.reqs:
            for u in eng.step()[0]:
                toks += u.token_ids
                final = u if u.finished else final
        assert toks == outs["plain"][: outs["plain"].index(stop) + 1]
        assert final.finish_reason == "stop" and final.matched == stop


def _scripted(overlap: bool, stop: int) -> tuple[dict[str, list[int]], dict, list[dict]]:
    """One fixed script: arrivals mid-run, an abort, a stop token, sampled and greedy requests, a
    chain, tier 0 and a tree, each change made the way the rank loop makes it (the iteration in
    flight read first). -> (tokens per request, final statistics per request, records)."""
    e = _engine(overlap)
    toks: dict[str, list[int]] = {}
    stats: dict[str, object] = {}
    records: list[dict] = []

    def keep(updates, rec=None):
        for u in updates:
            toks.setdefault(u.rid, []).extend(u.token_ids)
            if u.finished:
                stats[u.rid] = (u.finish_reason, u.spec)
        if rec is not None:
            records.append(rec)

    def add(rid, prompt, **kw):
        keep([u for u in [e.add_request(GenRequest(rid, prompt, **kw))] if u is not None])

    def change(cfg):
        keep(*e.drain())
        e.apply_config(cfg)

    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    add("greedy", [2, 40, 6], max_new_tokens=30, ignore_eos=True)
    add("sampled", [10, 12, 14], max_new_tokens=25, ignore_eos=True, temperature=0.8, seed=7)
    script = {2: lambda: add("late", [90, 7, 3], max_new_tokens=12, stop_token_ids=[stop]),
              4: lambda: keep([e.abort("sampled")]),
              5: lambda: change(SpecConfig(steps=0, num_draft_tokens=1, epoch=2)),
              7: lambda: add("again", [5, 6, 7, 8], max_new_tokens=9, ignore_eos=True, temperature=0.5, seed=3),
              8: lambda: change(SpecConfig(steps=3, topk=2, num_draft_tokens=6, epoch=3))}
    for it in range(40):
        if it in script:
            script[it]()
        keep(*e.step())
    keep(*e.drain())
    assert not e.busy and not e.reqs
    return toks, stats, records


def test_overlap_scheduler_runs_the_same_iterations():
    """Overlapped, an iteration is launched before the previous one is read; every request must
    still get exactly the tokens and statistics it gets without overlap (an aborted one: a prefix,
    since the iteration in flight at the abort is dropped)."""
    ref = _engine()
    ref.apply_config(SpecConfig(steps=0, num_draft_tokens=1, epoch=1))
    assert ref.add_request(GenRequest("p", [90, 7, 3], max_new_tokens=8, ignore_eos=True)) is None
    late = []
    while ref.busy:
        late += [t for u in ref.step()[0] for t in u.token_ids]
    stop = late[5]
    plain_toks, plain_stats, plain_recs = _scripted(False, stop)
    toks, stats, recs = _scripted(True, stop)
    assert plain_stats["late"][0] == "stop" and plain_stats["sampled"][0] == "abort"
    aborted = toks.pop("sampled")
    assert aborted == plain_toks.pop("sampled")[:len(aborted)]
    assert toks == plain_toks
    assert {k: v for k, v in stats.items() if k != "sampled"} == {k: v for k, v in plain_stats.items() if k != "sampled"}
    assert [r["epoch"] for r in recs] == sorted(r["epoch"] for r in recs)
    # A request finished by a stop token ran one more iteration whose result was dropped.
    assert any(r.get("dropped") for r in recs) and not any(r.get("dropped") for r in plain_recs)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_admission_leaves_its_first_token_on_the_device_until_the_next_read(overlap):
    """add_request queues the prefill and returns nothing (no wait for the GPU); the first token
    comes with the next step's updates, ahead of the request's later tokens. A request that the
    first token finishes (max_new_tokens 1) is never launched and frees its row."""
    ref = _engine(overlap)
    ref.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    assert ref.add_request(GenRequest("a", [2, 40, 6], max_new_tokens=6, ignore_eos=True)) is None
    assert ref.reqs["a"].completion_tokens == 0
    root = int(ref.row_root[ref.reqs["a"].row])
    ups, _ = ref.step()
    assert ups and ups[0].rid == "a" and ups[0].token_ids[0] == root
    toks = [t for u in ups for t in u.token_ids]
    while ref.busy:
        toks += [t for u in ref.step()[0] for t in u.token_ids]
    assert len(toks) == 6

    e = _engine(overlap)
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    free = len(e.free_rows)
    assert e.add_request(GenRequest("one", [2, 40, 6], max_new_tokens=1, ignore_eos=True)) is None
    launches = e._launches
    ups, rec = e.step()
    assert rec is None and e._launches == launches, "a request the first token finishes was launched"
    assert [(u.rid, u.token_ids, u.finished, u.finish_reason) for u in ups] == [("one", toks[:1], True, "length")]
    assert not e.busy and not e.reqs and len(e.free_rows) == free


def test_a_request_admitted_during_a_step_is_prefilled_after_the_launch_and_read_later():
    """Engine.step(admit): the next iteration is launched first, then the prefill is queued; the
    read that follows does not wait for that prefill (its first token stays pending until an
    iteration queued behind it is launched), and the request's tokens still arrive in order."""
    e = _engine(True)
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    assert e.add_request(GenRequest("old", [2, 40, 6], max_new_tokens=40, ignore_eos=True)) is None
    got: dict[str, list[int]] = {}

    def keep(updates):
        for u in updates:
            got.setdefault(u.rid, []).extend(u.token_ids)

    keep(e.step()[0])

    keep(e.step(lambda: e.add_request(GenRequest("new", [5, 6, 7], max_new_tokens=9, ignore_eos=True)))[0])
    new = e.reqs["new"]
    assert [r.rid for r in e.inflight.reqs] == ["old"], "the admitted request joined the launch before it"
    assert new.first is not None and "new" not in got, "the read waited for a prefill queued after the launch"
    keep(e.step()[0])
    assert new.first is None and len(got["new"]) >= 1
    while e.busy:
        keep(e.step()[0])
    ref = _engine(True)
    ref.apply_config(SpecConfig(steps=0, num_draft_tokens=1, epoch=1))
    ref.add_request(GenRequest("new", [5, 6, 7], max_new_tokens=9, ignore_eos=True))
    alone = []
    while ref.busy:
        alone += [t for u in ref.step()[0] for t in u.token_ids]
    assert got["new"] == alone and len(got["old"]) == 40
