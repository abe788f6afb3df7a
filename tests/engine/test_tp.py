"""Tensor parallelism: TP2 ≡ TP1 for the target (logits, aux) and the sharded EAGLE-3 head, and
the communicator counts exactly the collectives the Megatron layout implies."""

from __future__ import annotations

import datetime

import pytest
import torch

from refengine import presets
from refengine.models.layers import causal_meta


@pytest.fixture(scope="module")
def tp2_outputs():
    import multiprocessing as mp

    import torch.distributed as dist

    from . import tp_worker

    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    q = ctx.Queue()
    procs = [ctx.Process(target=tp_worker.run, args=(r, 2, store.port, q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict((item[0], item) for item in (q.get(timeout=120) for _ in range(2)))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return results


def _tp1():
    torch.set_num_threads(1)
    target = presets.build_target("tiny", seed=3).double()
    head = presets.build_head("tiny-eagle3", seed=3).double()
    head.set_embed(target.model.embed_tokens)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    meta = causal_meta(torch.arange(2), torch.arange(12).expand(2, 12), 16)
    with torch.no_grad():
        hidden, aux = target(ids, meta, target.make_kv(2, 16, torch.float64, "cpu"))
        dlogits, dhidden = head(ids, aux, meta, head.make_kv(2, 16, torch.float64, "cpu"))
        return target.logits(hidden), aux, dlogits, dhidden


def test_tp2_equals_tp1(tp2_outputs):
    logits, aux, dlogits, dhidden = _tp1()
    for rank in (0, 1):
        _, l2, a2, dl2, dh2 = (torch.from_numpy(x) if i else x for i, x in enumerate(tp2_outputs[rank][:5]))
        # float64: only summation order differs between TP1 and TP2.
        torch.testing.assert_close(l2, logits, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a2, aux, rtol=1e-10, atol=1e-10)   # aux replicated on every rank
        torch.testing.assert_close(dl2, dlogits, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(dh2, dhidden, rtol=1e-10, atol=1e-10)


def test_comm_counts_match_layout(tp2_outputs):
    layers = presets.TARGETS["tiny"].num_hidden_layers
    for rank in (0, 1):
        *_, calls, by_op, nbytes = tp2_outputs[rank]
        # target: embedding all-reduce + (o_proj, down_proj) per layer + lm_head all-gather
        assert calls["verify"] == 1 + 2 * layers + 1
        # sharded head: embedding all-reduce + o_proj + down_proj + lm_head all-gather
        assert calls["draft"] == 4
        assert by_op == {"all_reduce": 2 + 2 * layers + 2, "all_gather": 2}
        # all-reduce of [2, 12, 64] float64 per call; the gathers carry world × local slice
        h = presets.TARGETS["tiny"].hidden_size
        expected = (1 + 2 * layers) * 2 * 12 * h * 8 + 2 * (2 * 12 * 128 * 8)
        assert nbytes["verify"] == expected
