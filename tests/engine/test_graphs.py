"""The graph cache's bookkeeping on CPU: mode resolution and fallbacks, keys and buckets, when a
capture happens, replays reusing static buffers, eviction per scope, failed captures running
eagerly, collectives counted at capture and added per replay, and padding that leaves the real
rows' results unchanged (a real tiny target and head, float64)."""

from __future__ import annotations

import pytest
import torch

from refengine import presets
from refengine.comm import Communicator
from refengine.graphs import (GROUP, LOCAL, GraphCache, GraphKey, ctx_bucket, graphed_chain, graphed_forward,
                              resolve_mode, row_buckets)
from refengine.models.layers import causal_meta

torch.set_num_threads(1)


def _cache(mode="static", max_graphs=64, comm=None, **kw):
    return GraphCache(mode, comm or Communicator(0, 1), max_rows=8, row_len=600, max_graphs=max_graphs, **kw)


def _key(phase="verify", rows=1, shape=(1, 256, 0), placement="-"):
    return GraphKey(phase, placement, rows, shape)


class Body:
    """A forward with a visible side effect count; `ops` collectives go through the real
    communicator's accounting span (no process group is needed for that)."""

    def __init__(self, comm: Communicator | None = None, ops: int = 0, fail: bool = False):
        self.calls, self.comm, self.ops, self.fail = 0, comm, ops, fail

    def __call__(self, x):
        self.calls += 1
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        for _ in range(self.ops):
            with self.comm._op("all_reduce", x["a"]):
                pass
        return (x["a"] * 2 + 1, x["a"].sum(-1, keepdim=True))


def test_resolve_mode_and_fallbacks():
    assert resolve_mode("auto", "cpu", False) == ("off", None)
    mode, why = resolve_mode("cuda", "cpu", False)
    assert mode == "off" and "CUDA device" in why
    assert resolve_mode("static", "cpu", False) == ("static", None)
    mode, why = resolve_mode("static", "cpu", True)
    assert mode == "off" and "emulated comm latency" in why
    with pytest.raises(ValueError, match="cuda_graph must be one of"):
        resolve_mode("sometimes", "cpu", False)
    with pytest.raises(ValueError, match="unresolved"):
        GraphCache("auto", Communicator(0, 1), 4, 100)


def test_buckets():
    assert row_buckets(8) == (1, 2, 4, 8)
    assert row_buckets(6) == (1, 2, 4, 6)
    assert row_buckets(1) == (1,)
    assert [ctx_bucket(c, 600) for c in (1, 256, 257, 512, 513, 5000)] == [256, 256, 512, 512, 600, 600]
    c = _cache()
    assert [c.rows_for(b) for b in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="exceeds"):
        c.rows_for(9)


def test_first_call_captures_then_replays_into_static_buffers():
    c, body = _cache(), Body()
    a = torch.arange(6.0).view(2, 3)
    out1 = c.run(_key(rows=2), LOCAL, {"a": a}, body)
    (ev,) = c.drain_events()
    assert ev.ok and ev.key == _key(rows=2) and ev.comm_calls == 0 and ev.ms >= 0
    assert c.stats.captures == 1 and c.stats.replays == 0
    out2 = c.run(_key(rows=2), LOCAL, {"a": a + 10}, body)
    assert c.drain_events() == [] and c.stats.replays == 1
    assert out2[0].data_ptr() == out1[0].data_ptr(), "a replay writes the key's static outputs"
    torch.testing.assert_close(out2[0], (a + 10) * 2 + 1)
    torch.testing.assert_close(out2[1], (a + 10).sum(-1, keepdim=True))
    # A new shape is a new key: captured when first needed, the old one kept.
    c.run(_key(rows=2, shape=(4, 256, 0)), LOCAL, {"a": a}, body)
    assert [e.key.shape for e in c.drain_events()] == [(4, 256, 0)]
    assert _key(rows=2) in c and len(c.keys()) == 2


def test_off_mode_is_plain_eager():
    c, body = _cache("off"), Body()
    a = torch.ones(1, 2)
    for _ in range(3):
        torch.testing.assert_close(c.run(_key(), LOCAL, {"a": a}, body)[0], a * 2 + 1)
    assert body.calls == 3 and c.keys() == [] and c.drain_events() == [] and c.stats.eager_calls == 3


def test_eviction_is_lru_per_scope():
    c, body = _cache(max_graphs=2), Body()
    a = torch.ones(1, 1)
    for s in (1, 2):
        c.run(_key(shape=(s, 256, 0)), GROUP, {"a": a}, body)
    c.run(_key(shape=(9, 256, 0), placement="rank0", phase="draft_step"), LOCAL, {"a": a}, body)
    c.run(_key(shape=(1, 256, 0)), GROUP, {"a": a}, body)          # touch: 2 is now the oldest
    c.run(_key(shape=(3, 256, 0)), GROUP, {"a": a}, body)
    assert _key(shape=(2, 256, 0)) not in c and _key(shape=(1, 256, 0)) in c
    assert _key(shape=(9, 256, 0), placement="rank0", phase="draft_step") in c, "the local scope is separate"
    assert c.stats.evictions == 1
    assert c.invalidate(lambda k: k.placement == "rank0") == 1 and len(c.keys()) == 2


def test_failed_capture_runs_eagerly_from_then_on():
    c = _cache()
    bad = Body(fail=True)
    with pytest.raises(RuntimeError):
        # The eager fallback is the same body: a body that cannot run at all still raises.
        c.run(_key(), LOCAL, {"a": torch.ones(1, 1)}, bad)
    (ev,) = c.drain_events()
    assert not ev.ok and "stream is capturing" in ev.reason
    assert c.stats.failures


class FailsOnceCapturing(Body):
    """Fails only inside the capture (as a CUDA capture of an uncapturable op would)."""

    def __init__(self, comm):
        super().__init__(comm)
        self.capturing = lambda: comm._capture is not None

    def __call__(self, x):
        if self.capturing():
            raise RuntimeError("operation not permitted when stream is capturing")
        return super().__call__(x)


def test_capture_failure_falls_back_to_eager_with_reason():
    comm = Communicator(0, 1)
    c, body = _cache(comm=comm), FailsOnceCapturing(comm)
    a = torch.ones(2, 2)
    out = c.run(_key(), LOCAL, {"a": a}, body)
    torch.testing.assert_close(out[0], a * 2 + 1)
    (ev,) = c.drain_events()
    assert not ev.ok and "RuntimeError" in ev.reason
    torch.testing.assert_close(c.run(_key(), LOCAL, {"a": a + 1}, body)[0], (a + 1) * 2 + 1)
    assert c.stats.captures == 0 and c.stats.eager_calls == 2 and c.stats.replays == 0
    assert c.stats_dict()["keys"][0]["eager"].startswith("RuntimeError")


def test_collectives_counted_at_capture_and_added_per_replay():
    comm = Communicator(0, 1)
    c, body = _cache(comm=comm), Body(comm, ops=3)
    a = torch.ones(1, 4)
    comm.phase = "verify"
    c.run(_key(), GROUP, {"a": a}, body)
    assert c.drain_events()[0].comm_calls == 3
    c.run(_key(), GROUP, {"a": a}, body)
    comm.phase = "draft"
    with comm._op("broadcast", a):     # an eager collective beside the graphs
        pass
    calls, nbytes = comm.drain_graph()
    assert calls == {"verify": 6} and nbytes == {"verify": 6 * 16}
    ms, eager_calls, _ = comm.drain()
    assert eager_calls == {"draft": 1} and "verify" not in ms, "in-graph collectives have no time"
    assert comm.totals.graph_calls["verify"] == 6 and comm.totals.by_op["all_reduce"] == 6


def test_static_replay_checks_the_captured_collectives():
    comm = Communicator(0, 1)
    body = Body(comm, ops=1)
    c = _cache(comm=comm)
    c.run(_key(), LOCAL, {"a": torch.ones(1, 1)}, body)
    body.ops = 2
    with pytest.raises(RuntimeError, match="replay ran collectives"):
        c.run(_key(), LOCAL, {"a": torch.ones(1, 1)}, body)


def test_replay_timing_is_per_key():
    c, body = _cache(time_replays=True), Body()
    for _ in range(3):
        c.run(_key(), LOCAL, {"a": torch.ones(1, 1)}, body)
    (k,) = c.stats_dict()["keys"]
    assert k["replays"] == 2 and k["replay_ms_mean"] >= 0 and k["scope"] == LOCAL


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = presets.build_target("tiny", seed=5).double().eval()
    head = presets.build_head("tiny-eagle3", seed=5).double().eval()
    head.set_embed(target.model.embed_tokens)
    return target, head


def test_padding_keeps_real_rows_and_touches_only_the_pad_row(tiny):
    """3 requests padded to 4 rows and ctx 40 -> 256: the real rows' outputs and KV equal eager."""
    target, head = tiny
    rows, row_len, pad_row = 5, 300, 5
    ids = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([[10, 11, 12, 13], [3, 4, 5, 6], [30, 31, 32, 33]])
    rows_t = torch.tensor([4, 0, 2])
    meta = causal_meta(rows_t, positions, 40)
    kv_eager = target.make_kv(rows + 1, row_len, torch.float64, "cpu")
    kv_graph = target.make_kv(rows + 1, row_len, torch.float64, "cpu")
    for kv in (kv_eager, kv_graph):          # the same history in both pools
        g = torch.Generator().manual_seed(2)
        for t in kv.k + kv.v:
            t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
    pad_before = [t[pad_row].clone() for t in kv_graph.k]
    with torch.no_grad():
        h_e, aux_e = target(ids, meta, kv_eager)
        c = GraphCache("static", Communicator(0, 1), max_rows=rows, row_len=row_len)
        h_g, aux_g = graphed_forward(c, "verify", "-", LOCAL, ids, None, meta, pad_row,
                                     lambda i, _h, m: target(i, m, kv_graph))
        (ev,) = c.drain_events()
        assert ev.key == GraphKey("verify", "-", 4, (4, 256, 0))
        torch.testing.assert_close(h_g, h_e, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(aux_g, aux_e, rtol=1e-12, atol=1e-12)
        for a, b in zip(kv_graph.k, kv_eager.k):
            torch.testing.assert_close(a[:rows], b[:rows], rtol=0, atol=0)
        assert any(not torch.equal(a[pad_row], b) for a, b in zip(kv_graph.k, pad_before)), "pad row unused?"
        # The head over the same meta (draft-extend shape: 3H-wide aux), then a replay.
        hk = head.make_kv(rows + 1, row_len, torch.float64, "cpu")
        hk2 = head.make_kv(rows + 1, row_len, torch.float64, "cpu")
        le, oe = head(ids, aux_e, meta, hk)
        lg, og = graphed_forward(c, "draft_extend", "replicated", LOCAL, ids, aux_e, meta, pad_row,
                                 lambda i, h, m: head(i, h, m, hk2))
        torch.testing.assert_close(lg, le, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(og, oe, rtol=1e-12, atol=1e-12)
        assert c.drain_events()[0].key.shape == (4, 256, 3 * 64)
        lg2, _ = graphed_forward(c, "draft_extend", "replicated", LOCAL, ids, aux_e, meta, pad_row,
                                 lambda i, h, m: head(i, h, m, hk2))
        torch.testing.assert_close(lg2, le, rtol=1e-12, atol=1e-12)
        assert c.drain_events() == [] and c.stats.replays == 1


def test_graphed_chain_equals_the_eager_chain_and_keeps_its_state_in_the_key(tiny):
    """Greedy chains through one in-place key: the same drafts and draft KV as spec.draft_chain,
    for 3 requests padded to 4 rows and then 1 request in a fresh bucket and 3 again (stale pad
    state from a larger batch must not leak), with one capture per (rows, ctx) and replays after."""
    from refengine import spec

    target, head = tiny
    rows, row_len, pad_row, h = 5, 300, 5, head.config.hidden_size
    kv_e = head.make_kv(rows + 1, row_len, torch.float64, "cpu")
    kv_g = head.make_kv(rows + 1, row_len, torch.float64, "cpu")
    c = GraphCache("static", Communicator(0, 1), max_rows=rows, row_len=row_len)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for rows_t, steps in [([4, 0, 2], 4), ([1], 3), ([3, 0, 2], 5), ([4, 0, 1, 2], 2)]:
            rows_t = torch.tensor(rows_t)
            b = rows_t.shape[0]
            seq = torch.randint(5, 60, (b,), generator=g)
            first = torch.randint(0, 256, (b,), generator=g)
            hidden = torch.randn(b, h, generator=g, dtype=torch.float64)
            want = spec.draft_chain(head, kv_e, rows_t, seq, first, hidden, steps, 256)
            got = graphed_chain(c, "replicated", LOCAL, head, kv_g, rows_t, seq, first, hidden, steps, 256, pad_row)
            assert torch.equal(got, want)
            for a, e in zip(kv_g.k + kv_g.v, kv_e.k + kv_e.v):
                torch.testing.assert_close(a[:rows], e[:rows], rtol=1e-12, atol=1e-12)
    keys = [e.key for e in c.drain_events()]
    assert keys == [GraphKey("draft_step", "replicated", 4, (1, 256, h, "chain")),
                    GraphKey("draft_step", "replicated", 1, (1, 256, h, "chain"))], keys
    assert c.stats.replays == (4 - 1) + (3 - 1) + (5 - 1) + (2 - 1) - 2


def _engine(mode: str, overlap: bool = False):
    from refengine.config import EngineOptions, SpecConfig
    from refengine.engine import Engine

    opts = EngineOptions(model_path="tiny-agreeing", load_format="dummy", dtype="float64", max_running_requests=4,
                         context_length=256, cuda_graph=mode, disable_overlap_schedule=not overlap)
    target, head = presets.load_models("tiny-agreeing", None, "dummy")
    e = Engine(opts, Communicator(0, 1), target, head, torch.device("cpu"), torch.float64)
    return e, SpecConfig


def _drive(mode: str, overlap: bool = False) -> list[tuple]:
    """A fixed schedule in one process: chain, steps 0 (tier 0: the draft extended every iteration), back on with
    another placement, a tree. Returns every iteration's (steps, accepted, committed tokens). Overlapped, the
    iteration in flight is read before each change, as the rank loop does."""
    from refengine.messages import GenRequest

    e, SpecConfig = _engine(mode, overlap)
    out, epoch = [], 0

    def keep(updates, rec):
        if rec is not None:
            out.append((rec["steps"], tuple(rec["accepted"]), tuple(tuple(u.token_ids) for u in updates)))

    def config(**kw):
        nonlocal epoch
        keep(*e.drain())
        epoch += 1
        e.apply_config(SpecConfig(**{"steps": 3, "topk": 1, "num_draft_tokens": 4, "placement": "sharded", **kw},
                                  epoch=epoch))

    config()
    for i, p in enumerate([[2, 40, 6], [10, 12, 14, 16, 18], [90, 7, 3, 1]]):
        e.add_request(GenRequest(f"r{i}", p, max_new_tokens=60, ignore_eos=True))
    schedule = [(dict(), 3), (dict(steps=0, num_draft_tokens=1), 4), (dict(steps=2, num_draft_tokens=3,
                                                                            placement="rank0"), 3),
                (dict(steps=3, topk=4, num_draft_tokens=8, placement="replicated"), 3)]
    with torch.no_grad():
        for kw, n in schedule:
            config(**kw)
            for _ in range(n):
                keep(*e.step())
        keep(*e.drain())
    return out


def test_static_graphs_match_eager_iteration_by_iteration():
    """Same drafts accepted at every iteration: greedy outputs alone would not show a wrong draft
    input (e.g. a graph output buffer kept past the next replay), acceptance does."""
    eager, graphed = _drive("off"), _drive("static")
    assert graphed == eager
    assert _drive("static", overlap=True) == eager, "overlapped iterations must be the same iterations"
    assert sum(sum(acc) for _, acc, _ in eager[7:]) > 0, "the schedule must accept drafts after steps 0"


def test_prefill_bodies_are_captured_but_never_compiled():
    """Compiled code runs only where in_graph_body() is true: decode keys, not prefill keys (a new
    prompt-width bucket would otherwise compile long after warm-up)."""
    from refengine.graphs import in_graph_body

    c, seen = _cache(), []

    def body(x):
        seen.append(in_graph_body())
        return (x["a"] + 1,)
    for phase in ("prefill", "verify", "prefill"):
        c.run(_key(phase=phase), LOCAL, {"a": torch.zeros(1, 2)}, body)   # capture (static: runs the body)
        c.run(_key(phase=phase), LOCAL, {"a": torch.zeros(1, 2)}, body)   # replay (static: runs it again)
    assert seen == [False, False, True, True, False, False] and not in_graph_body()


def _prefill_engine(mode: str):
    from refengine.config import EngineOptions, SpecConfig
    from refengine.engine import Engine

    opts = EngineOptions(model_path="tiny-agreeing", load_format="dummy", dtype="float64", max_running_requests=2,
                         context_length=256, cuda_graph=mode)
    target, head = presets.load_models("tiny-agreeing", None, "dummy")
    e = Engine(opts, Communicator(0, 1), target, head, torch.device("cpu"), torch.float64)
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    return e


def test_graphed_prefill_equals_eager_and_long_prompts_stay_eager(monkeypatch):
    """A prompt padded to its width bucket and replayed: the same first token, target K/V of the
    prompt and draft state as the eager prefill, one prefill key per width bucket (target and
    draft), and a prompt past PREFILL_GRAPH_MAX prefilled eagerly."""
    from refengine import engine as engine_mod
    from refengine.messages import GenRequest

    eager, graphed = _prefill_engine("off"), _prefill_engine("static")
    prompt = [2, 40, 6, 8, 10]
    for e in (eager, graphed):
        assert e.add_request(GenRequest("p", prompt, max_new_tokens=8, ignore_eos=True)) is None
        e.first = [int(e.row_root[e.reqs["p"].row])]      # the first token, still on the device
    assert graphed.first == eager.first
    r_e, r_g = eager.reqs["p"], graphed.reqs["p"]
    n = len(prompt)
    for layer in range(len(eager.kv.k)):
        torch.testing.assert_close(graphed.kv.k[layer][r_g.row, :n], eager.kv.k[layer][r_e.row, :n], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(graphed.draft.kv.k[0][r_g.row, :n], eager.draft.kv.k[0][r_e.row, :n], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(graphed.draft.hidden[r_g.row], eager.draft.hidden[r_e.row], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(graphed.draft.logits[r_g.row], eager.draft.logits[r_e.row], rtol=1e-12, atol=1e-12)
    keys = [k for k in graphed.graphs.keys() if k.phase == "prefill"]
    assert sorted((k.placement, k.shape[0]) for k in keys) == [("-", 16), ("sharded", 16)]
    # Both go on to decode the same tokens.
    out = {}
    for tag, e in (("eager", eager), ("graphed", graphed)):
        toks = []
        while e.busy:
            toks += [t for u in e.step()[0] for t in u.token_ids]
        out[tag] = toks
    assert out["graphed"] == out["eager"] and len(out["eager"]) == 8 and out["eager"][0] == eager.first[0]
    monkeypatch.setattr(engine_mod, "PREFILL_GRAPH_MAX", 16)
    graphed.add_request(GenRequest("long", list(range(2, 22)), max_new_tokens=2, ignore_eos=True))
    assert [k for k in graphed.graphs.keys() if k.phase == "prefill"] == keys, "a long prompt prefills eagerly"
