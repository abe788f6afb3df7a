"""The compiled path on CPU: the target layer and the draft head trace as one graph each (any graph
break fails), compiled equals eager, a context bucket never recompiles, compiled code runs only
inside graph bodies, and an engine with --enable-torch-compile (static graphs, aot_eager: traced
like Inductor, no code generated) decodes exactly as plain decoding with no recompile after warm-up.
"""

from __future__ import annotations

import threading

import pytest
import torch

from tests.harness import wait_until
from refengine.client import EngineClient, EngineOptions, GenRequest
from refengine.compiled import compile_chain_tail, compile_forward, configure_dynamo, recompiles
from refengine.graphs import _in_body, chain_tail, in_graph_body
from refengine.models.layers import causal_meta, fuse_projections
from refengine.presets import build_head, build_target


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    configure_dynamo()
    with torch.no_grad():
        yield
    torch._dynamo.reset()


def _target():
    return fuse_projections(build_target("tiny-agreeing", 0).eval())


def test_target_layers_trace_whole_and_match_eager():
    t = _target()
    kv, kv2 = t.make_kv(3, 128, torch.float32, "cpu"), t.make_kv(3, 128, torch.float32, "cpu")
    ids = torch.randint(0, 120, (2, 5))
    pos = (torch.arange(5)[None] + torch.tensor([[3], [9]])).contiguous()
    meta = causal_meta(torch.tensor([0, 2]), pos, 64)
    ref, ref_aux = t(ids, meta, kv)
    before = recompiles()
    for layer in t.model.layers:
        compile_forward(layer, backend="aot_eager", fullgraph=True)    # a graph break raises
    with _in_body():
        out, aux = t(ids, meta, kv2)
        # A wider context bucket: the mask's width is dynamic, so nothing compiles again.
        compiled = recompiles()
        t(ids, causal_meta(torch.tensor([0, 2]), pos, 128), kv2)
    assert compiled - before == 2          # layer 0 (no residual delta yet) and the others
    assert recompiles() == compiled
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(aux, ref_aux, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv2.k[3], kv.k[3])      # the compiled KV write landed in the pool


def test_compiled_code_runs_only_inside_graph_bodies():
    t = _target()
    kv = t.make_kv(2, 64, torch.float32, "cpu")
    for layer in t.model.layers:
        compile_forward(layer, backend="aot_eager", fullgraph=True)
    meta = causal_meta(torch.tensor([0]), torch.arange(7)[None], 7)
    before = recompiles()
    assert not in_graph_body()
    t(torch.randint(0, 120, (1, 7)), meta, kv)         # a prefill: eager, whatever its length
    assert recompiles() == before


def test_draft_head_traces_whole_for_both_inputs():
    t = _target()
    head = build_head("tiny-agreeing-eagle3", 0).eval()
    head.set_embed(t.model.embed_tokens)
    fuse_projections(head.midlayer)
    kv = head.make_kv(2, 64, torch.float32, "cpu")
    meta = causal_meta(torch.tensor([1]), torch.tensor([[4, 5, 6]]), 32)
    ids = torch.randint(0, 120, (1, 3))
    aux = torch.randn(1, 3, 3 * t.config.hidden_size)         # draft-extend: through fc
    hid = torch.randn(1, 3, head.config.hidden_size)          # draft step: the head's own state
    ref = [head(ids, aux, meta, kv), head(ids, hid, meta, kv)]
    compile_forward(head, backend="aot_eager", fullgraph=True)
    with _in_body():
        got = [head(ids, aux, meta, kv), head(ids, hid, meta, kv)]
    for (lr, hr), (lg, hg) in zip(ref, got):
        torch.testing.assert_close(lg, lr, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hg, hr, rtol=1e-5, atol=1e-5)


def _chain_state(r: int, ctx: int, width: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(ctx)
    return {"logits": torch.randn(r, 1, 50, generator=g), "h": torch.randn(r, 1, width, generator=g),
            "d2t": torch.randint(0, 5, (50,), generator=g), "out": torch.zeros(r, 6, dtype=torch.long),
            "step": torch.tensor([2]), "ids": torch.zeros(r, 1, dtype=torch.long),
            "hidden": torch.zeros(r, 1, width), "positions": torch.tensor([[5], [ctx - 3], [0]])[:r],
            "mask": torch.zeros(r, 1, ctx, dtype=torch.bool)}


def test_chain_tail_traces_whole_matches_eager_and_a_context_bucket_never_recompiles():
    tail = compile_chain_tail(backend="aot_eager")
    before = compiled = None
    for ctx in (32, 64):
        ref, got = _chain_state(3, ctx), _chain_state(3, ctx)
        want = chain_tail(*ref.values())
        if before is None:
            before = recompiles()
        with _in_body():
            tok = tail(*got.values())             # fullgraph: a graph break raises
        if compiled is None:
            compiled = recompiles()
        torch.testing.assert_close(tok, want)
        for name in ref:                          # every in-place update, as the eager tail made it
            torch.testing.assert_close(got[name], ref[name])
        assert got["step"].item() == 3 and got["out"][:, 2].tolist() == want.tolist()
        assert got["mask"][1, 0].sum().item() == ctx - 1      # positions ctx-2: sees 0..ctx-2
    assert compiled - before == 1
    assert recompiles() == compiled, "a wider context bucket compiled again"


def _generate(client, config: dict, n: int = 24) -> list[int]:
    client.set_config(config)
    done, out = threading.Event(), []

    def on(u):
        out.extend(u.token_ids)
        if u.finished:
            done.set()
    client.submit(GenRequest(f"r{len(config)}-{config.get('speculative_num_steps')}-{config.get('speculative_eagle_topk')}",
                             [2, 40, 6, 8], max_new_tokens=n, ignore_eos=True), on)
    assert done.wait(300), "generation did not finish"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_engine_with_compile_decodes_as_plain_and_stops_compiling(tp):
    opts = EngineOptions(model_path="tiny-agreeing", load_format="dummy", tp_size=tp, dtype="float32",
                         speculative_num_steps=3, max_running_requests=2, context_length=256, threads_per_rank=1,
                         init_timeout_s=120, cuda_graph="static", enable_torch_compile=True,
                         torch_compile_backend="aot_eager")
    client = EngineClient.start(opts)
    try:
        sharded = {"speculative_draft_placement": "sharded"}
        configs = [{"speculative_num_steps": 0, **sharded}, {"speculative_num_steps": 3, "speculative_eagle_topk": 1, **sharded},
                   {"speculative_num_steps": 3, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6, **sharded},
                   {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_draft_placement": "replicated"}]
        outs = [_generate(client, c) for c in configs]           # warm-up: every shape compiled here
        assert all(o == outs[0] for o in outs), outs
        warm = _compiled_graphs(client)
        assert warm > 0
        again = [_generate(client, c) for c in configs]
        assert again == outs
        assert _compiled_graphs(client) == warm, "compiled again after warm-up"
    finally:
        client.close()


def _compiled_graphs(client) -> int:
    """The ranks' compiled-graph count, from stats that cover every iteration so far (ranks
    report every 0.25 s: wait until each rank's report has caught up with the phase stream)."""
    done = client.stats()["iterations_total"]

    def caught_up():
        per_rank = client.stats()["per_rank"]
        if len(per_rank) == client.opts.tp_size and all(r["iterations"] >= done for r in per_rank.values()):
            return per_rank
    per_rank = wait_until(caught_up, 60, "the ranks' stats to cover every iteration")
    return max(r["graphs"]["compiled_graphs"] for r in per_rank.values())
