"""KV invariants inside one engine (TP1, in process, float64): after every iteration (steps 0, SGLang's
tier 0, included) the target and draft KV lengths equal the committed length, and their contents equal a fresh recomputation
over the committed tokens, so compaction and positions are right, not just the bookkeeping."""

from __future__ import annotations

import torch

from refengine import presets
from refengine.comm import Communicator
from refengine.config import EngineOptions, SpecConfig
from refengine.engine import Engine
from refengine.messages import GenRequest
from refengine.models.layers import causal_meta

torch.set_num_threads(1)


def _engine() -> Engine:
    target = presets.build_target("tiny-agreeing")
    head = presets.build_head("tiny-agreeing-eagle3")
    opts = EngineOptions(max_running_requests=3, context_length=128)
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


def test_stops_truncate_after_eos_and_budget():
    e = _engine()
    e.apply_config(SpecConfig(steps=5, num_draft_tokens=6, epoch=1))
    plain = _engine()
    plain.apply_config(SpecConfig(steps=0, num_draft_tokens=1, epoch=1))
    outs = {}
    for eng, tag in ((plain, "plain"), (e, "spec")):
        first = eng.add_request(GenRequest("x", [2, 40, 6], max_new_tokens=30, ignore_eos=True))
        toks = list(first.token_ids)
        while eng.reqs:
            ups, _ = eng.step()
            toks += [t for u in ups for t in u.token_ids]
        outs[tag] = toks
    assert outs["plain"] == outs["spec"] and len(outs["spec"]) == 30
    stop = outs["plain"][7]
    for eng in (plain, e):
        first = eng.add_request(GenRequest("y", [2, 40, 6], max_new_tokens=30, stop_token_ids=[stop]))
        toks, final = list(first.token_ids), None
        while eng.reqs:
            for u in eng.step()[0]:
                toks += u.token_ids
                final = u if u.finished else final
        assert toks == outs["plain"][: outs["plain"].index(stop) + 1]
        assert final.finish_reason == "stop" and final.matched == stop
