"""The attention op: its torch reference against attention written out token by token (chain,
tree and padded masks, GQA groups), its contiguous output (what torch.compile's fake promises),
and the Triton kernel under Triton's CPU interpreter against the reference (every code path:
one split and several, one block of query rows and several)."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

from harness import run_under_triton_interpreter
from refengine.models.attend import attend, attend_reference, attention_backend, visible_limit


def _naive(q, kc, vc, rows, mask, scale):
    b, t, hq, d = q.shape
    g = hq // kc.shape[2]
    out = torch.zeros_like(q)
    for i in range(b):
        for j in range(t):
            seen = mask[i, j].nonzero()[:, 0]
            for h in range(hq):
                k, v = kc[rows[i], seen, h // g], vc[rows[i], seen, h // g]
                w = torch.softmax((k @ q[i, j, h]) * scale, 0)
                out[i, j, h] = w @ v
    return out


def _case(b, t, hq, hk, d, c, tree, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hq, d, generator=g, dtype=torch.float64)
    kc = torch.randn(b + 1, c + 4, hk, d, generator=g, dtype=torch.float64)
    vc = torch.randn(b + 1, c + 4, hk, d, generator=g, dtype=torch.float64)
    rows = torch.randperm(b + 1, generator=g)[:b]
    pos = torch.randint(0, c - t, (b, 1), generator=g) + torch.arange(t)[None]
    mask = torch.arange(c)[None, None] <= pos[:, :, None]
    if tree:
        mask &= torch.rand(b, t, c, generator=g) < 0.6
        mask.scatter_(2, pos[:, :, None], True)
    return q, kc, vc, rows, mask


@pytest.mark.parametrize("tree", [False, True])
def test_reference_is_attention_token_by_token(tree):
    q, kc, vc, rows, mask = _case(2, 3, 4, 2, 8, 20, tree)
    got = attend(q, kc, vc, rows, mask, 0.3)
    torch.testing.assert_close(got, _naive(q, kc, vc, rows, mask, 0.3))
    assert got.is_contiguous()                 # the fake implementation promises a contiguous output
    assert torch.equal(got, attend_reference(q, kc, vc, rows, mask, 0.3))


def test_the_visible_limit_is_one_past_the_last_column_any_query_of_a_request_sees():
    mask = torch.zeros(3, 2, 10, dtype=torch.bool)
    mask[0, 0, :4] = True                       # a chain: the later query sees further
    mask[0, 1, :5] = True
    mask[1, :, 0] = True                        # a graph's pad row: slot 0 only
    mask[2, 0, :3] = True                       # a tree: a branch's column past a gap
    mask[2, 1, [0, 1, 2, 7]] = True
    assert visible_limit(mask).tolist() == [5, 1, 8]
    assert visible_limit(mask).dtype == torch.int32


def test_the_op_takes_a_limit_and_its_cpu_form_answers_the_same():
    q, kc, vc, rows, mask = _case(2, 3, 4, 2, 8, 20, tree=True)
    assert "Tensor? limit=None" in str(attend._opoverload._schema)      # what the layers pass on CUDA
    assert torch.equal(attend(q, kc, vc, rows, mask, 0.3, visible_limit(mask)), attend(q, kc, vc, rows, mask, 0.3))


def test_the_layers_compute_the_limit_once_per_forward_and_only_for_the_kernel(monkeypatch):
    """On CUDA every layer of a forward shares one visible_limit (a graph replays it once); off
    CUDA, or with attend.USE_LIMIT off, the layers pass None and compute nothing."""
    from types import SimpleNamespace

    from refengine.models import attend as attend_mod
    from refengine.models import layers

    calls = []
    monkeypatch.setattr(layers, "visible_limit", lambda m: calls.append(m) or visible_limit(m))
    mask = torch.arange(6)[None, None] <= torch.tensor([[2], [4]])[:, :, None]       # [2, 1, 6]
    meta = layers.causal_meta(torch.arange(2), torch.tensor([[2], [4]]), 6)
    cuda_q = SimpleNamespace(is_cuda=True)
    first, again = layers._limit(meta, cuda_q), layers._limit(meta, cuda_q)
    assert first is again and first.tolist() == [3, 5] and torch.equal(meta.mask, mask) and len(calls) == 1
    fresh = layers.causal_meta(torch.arange(2), torch.tensor([[2], [4]]), 6)
    assert layers._limit(fresh, SimpleNamespace(is_cuda=False)) is None
    monkeypatch.setattr(attend_mod, "USE_LIMIT", False)
    assert layers._limit(fresh, cuda_q) is None and len(calls) == 1


def test_cpu_runs_the_reference():
    assert attention_backend("cpu", 128, torch.bfloat16) == "torch"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernel_matches_the_reference_under_the_interpreter():
    # The interpreter must be chosen before Triton is imported: a child process.
    script = textwrap.dedent("""
        import torch
        from refengine.models import triton_attend as ta
        from refengine.models.attend import attend_reference, visible_limit
        torch.cuda.current_device = lambda: 0       # the interpreter runs on CPU tensors
        cases = [  # (b, t, hq, hk, d, c, tree, SMs): one split, several splits, several query blocks
            (1, 1, 8, 2, 32, 70, False, 1), (1, 1, 8, 2, 32, 300, False, 132), (2, 4, 8, 2, 32, 130, True, 132),
            (1, 40, 8, 2, 32, 96, True, 132)]
        for b, t, hq, hk, d, c, tree, sms in cases:
            ta._SMS[0] = sms
            g = torch.Generator().manual_seed(b * 100 + t)
            q = torch.randn(b, t, hq, d, generator=g)
            kc, vc = torch.randn(b + 1, c + 4, hk, d, generator=g), torch.randn(b + 1, c + 4, hk, d, generator=g)
            rows = torch.randperm(b + 1, generator=g)[:b]
            pos = torch.randint(0, c - t, (b, 1), generator=g) + torch.arange(t)[None]
            mask = torch.arange(c)[None, None] <= pos[:, :, None]
            if tree:
                mask &= torch.rand(b, t, c, generator=g) < 0.6
                mask.scatter_(2, pos[:, :, None], True)
            plan = ta.plan(b, t, hq, hk, c, d, sms)
            want = attend_reference(q, kc, vc, rows, mask, d ** -0.5)
            # Skipping hidden columns' K/V, or stopping at the visible limit, changes nothing computed.
            for skip, limit in ((False, None), (True, None), (False, visible_limit(mask))):
                err = (ta.attend(q, kc, vc, rows, mask, d ** -0.5, skip_hidden=skip, limit=limit) - want).abs().max()
                assert err < 1e-5, (b, t, c, plan, skip, limit, float(err))
            print("ok", plan)
        # Hidden columns poisoned with NaN: skipping them leaves the output clean, reading them
        # does not (0 * NaN), which shows the skipping launch never loads them.
        ta._SMS[0] = 1
        g = torch.Generator().manual_seed(7)
        q = torch.randn(2, 1, 8, 32, generator=g)
        kc, vc = torch.randn(3, 132, 2, 32, generator=g), torch.randn(3, 132, 2, 32, generator=g)
        rows, mask = torch.tensor([2, 0]), (torch.arange(128)[None, None] < 40).expand(2, 1, 128)
        want = attend_reference(q, kc, vc, rows, mask, 0.2)
        kc[:, 40:], vc[:, 40:] = float("nan"), float("nan")
        assert (ta.attend(q, kc, vc, rows, mask, 0.2, skip_hidden=True) - want).abs().max() < 1e-5
        assert ta.attend(q, kc, vc, rows, mask, 0.2).isnan().any()
        print("skip ok")
        # The same poison past the visible limit (40 for both requests): the limit never loads it,
        # with one split and with several (the splits share out the live columns only).
        lim = visible_limit(mask)
        assert lim.tolist() == [40, 40] and lim.dtype == torch.int32
        for sms in (1, 132):
            ta._SMS[0] = sms
            assert (ta.attend(q, kc, vc, rows, mask, 0.2, limit=lim) - want).abs().max() < 1e-5
        print("limit ok")
    """)
    out = run_under_triton_interpreter(script)
    plans = [eval(line[3:]) for line in out.splitlines() if line.startswith("ok ")]
    assert len(plans) == 4 and "skip ok" in out and "limit ok" in out
    # (BLOCK_M, row blocks, BLOCK_N, splits): the cases reach one split and several (the combine
    # kernel), one block of query rows and several.
    assert plans[0][3] == 1 and plans[1][3] > 1 and plans[3][1] > 1


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_the_launch_plan_splits_small_batches_and_not_large_ones():
    from refengine.models import triton_attend as ta

    # (BLOCK_M, row blocks, BLOCK_N, splits) at the 8B's heads (32 query heads, 8 KV heads, 128 wide)
    # on 132 SMs. Batch 1: 8 programs, the context split until the SMs are covered twice (6 blocks).
    assert ta.plan(1, 1, 32, 8, 322, 128, 132) == (16, 1, 64, 6)
    # 32 and 64 rows: 256 and 512 programs cover the SMs, so no split and 32-column blocks (the
    # H200 sweep's fastest; the old rule split 32 rows in two).
    assert ta.plan(32, 4, 32, 8, 325, 128, 132) == (16, 1, 32, 1)
    assert ta.plan(64, 1, 32, 8, 322, 128, 132) == (16, 1, 32, 1)
    # 16 rows × 4 tokens: 128 programs, just under the SMs: still split (3 ways).
    assert ta.plan(16, 4, 32, 8, 325, 128, 132) == (16, 1, 64, 3)
    # A 512-token prefill (64-row query blocks, 256 programs) keeps the old rule: 2 splits of 64.
    assert ta.plan(1, 512, 32, 8, 1024, 128, 132) == (64, 32, 64, 2)
