"""Training-time test: the unrolled TTT forward equals step-by-step inference, and the loss."""

from __future__ import annotations

import torch

from refengine.train import models
from refengine.train.evaluate import _head_layer
from refengine.train.ttt import LOSS_DECAY, shift_left, ttt_loss, ttt_unroll

from .conftest import SMALL


def test_ttt_step_k_equals_chain_inference_at_every_position(small_models):
    """Step k at position t must see exactly what a drafting chain sees: the committed context
    0..t from real features, then its own k earlier outputs (teacher-forced tokens here)."""
    target, head, _, hcfg = small_models
    torch.manual_seed(1)
    T, K = 12, 4
    ids = torch.randint(0, 256, (2, T))
    with torch.no_grad():
        _, aux = models.target_forward(target, ids, SMALL.aux_layer_ids)
        ttt = ttt_unroll(head, models.target_embedding(target), aux, ids, K,
                         models.head_attn_shape(hcfg))
    shape = models.head_attn_shape(hcfg)
    embed = models.target_embedding(target)
    for b in range(2):
        for t in range(T - K - 1):
            kc, vc = [], []
            with torch.no_grad():
                logits, h = _head_layer(head, embed(ids[b, 1:t + 2]), head.fc(aux[b, :t + 1]),
                                        torch.arange(t + 1), kc, vc, shape)
                torch.testing.assert_close(logits[-1], ttt[0][b, t], atol=1e-5, rtol=1e-5)
                hidden = h[-1:]
                for k in range(1, K):
                    logits, hidden = _head_layer(head, embed(ids[b, t + 1 + k:t + 2 + k]), hidden,
                                                 torch.tensor([t + k]), kc, vc, shape)
                    torch.testing.assert_close(logits[-1], ttt[k][b, t], atol=1e-5, rtol=1e-5)


def test_ttt_loss_is_decayed_soft_ce_on_the_draft_vocab(small_models):
    _, head, _, _ = small_models
    torch.manual_seed(2)
    B, T, V, Dv = 2, 9, head.t2d.numel(), head.d2t.numel()
    used = torch.arange(Dv) + head.d2t
    target_logits = torch.randn(B, T, V) * 3
    target_logits[..., used[::2]] += 6.0  # argmax in and out of the draft vocabulary
    draft = [torch.randn(B, T, Dv) for _ in range(3)]
    res = ttt_loss(draft, target_logits, head.d2t, head.t2d)
    want = torch.zeros(())
    for k, dl in enumerate(draft):
        z = shift_left(target_logits, k + 1)
        valid = torch.zeros(B, T)
        valid[:, : T - k - 1] = 1
        mask = valid * head.t2d[z.argmax(-1)].float()
        ce = -(torch.softmax(z[..., used], -1) * torch.log_softmax(dl, -1)).sum(-1)
        lk = (ce * mask).sum() / mask.sum()
        assert abs(res.per_step[k] - lk.item()) < 1e-4
        want = want + LOSS_DECAY ** k * lk
    torch.testing.assert_close(res.total, want, atol=1e-4, rtol=1e-5)


def test_ttt_loss_is_minimal_when_the_draft_matches_the_target(small_models):
    _, head, _, _ = small_models
    torch.manual_seed(3)
    used = torch.arange(head.d2t.numel()) + head.d2t
    z = torch.randn(1, 6, head.t2d.numel())
    z[..., used] += 4.0  # most argmaxes inside the draft vocabulary, so the mask keeps positions
    matched = [shift_left(z, 1)[..., used]]
    other = [matched[0] + torch.randn_like(matched[0])]
    assert ttt_loss(matched, z, head.d2t, head.t2d).total < ttt_loss(other, z, head.d2t,
                                                                      head.t2d).total


def test_chain_evaluator_is_lossless_on_a_context_sensitive_target(small_models):
    """Random weights make every token depend on its context, so drafts are often rejected: the
    evaluator's output must still be the target's own greedy continuation."""
    from refengine.train.evaluate import generate_chain

    target, head, _, hcfg = small_models
    prompt = torch.tensor([5, 77, 130, 9, 200])
    plain = prompt.tolist()
    with torch.no_grad():
        for _ in range(16):
            logits, _ = models.target_forward(target, torch.tensor([plain]), SMALL.aux_layer_ids)
            plain.append(int(logits[0, -1].argmax()))
    assert len(set(plain[5:])) > 3
    for steps in (1, 2, 4):
        out, stats = generate_chain(target, head, hcfg, SMALL.aux_layer_ids, prompt, 16, steps)
        assert out[:16] == plain[5:]
        assert stats.verifies > 0 and 1.0 <= stats.tau <= steps + 1
