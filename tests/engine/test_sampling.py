"""Sampling verification is lossless: tokens committed by target-only tree sampling and by chain
rejection sampling follow the target's distribution (χ² on a tiny vocabulary, fixed seed), and the
tree/greedy building blocks behave as SGLang's."""

from __future__ import annotations

import torch

from refengine import spec

torch.set_num_threads(1)
V = 6
N_SAMPLES = 40000
CHI2_DF5_P001 = 20.52    # χ² critical value, 5 degrees of freedom, p = 0.001


def _chi2(samples: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=V).double()
    expected = p.double() * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with zero target probability was produced"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _dists(gen, n):
    return torch.softmax(torch.randn(n, V, generator=gen, dtype=torch.float64) * 1.5, -1)


def test_target_only_tree_sampling_matches_target_distribution():
    g = torch.Generator().manual_seed(0)
    p = _dists(g, 4)                                  # target distribution at each node
    # root -> children tokens 2 (node 1) and 4 (node 2); node 1 -> token 5 (node 3)
    tokens = torch.tensor([[0, 2, 4, 5]]).expand(N_SAMPLES, 4)
    parents = torch.tensor([[-1, 0, 0, 1]]).expand(N_SAMPLES, 4)
    probs = p[None].expand(N_SAMPLES, 4, V)
    coins = torch.rand(N_SAMPLES, 3, generator=g, dtype=torch.float64)
    path, accepted, bonus = spec.verify_tree_sample(tokens, parents, probs, coins, steps=2)
    tok_path = tokens.gather(1, path.clamp(min=0))
    first = torch.where(accepted >= 1, tok_path[:, 1], bonus)
    assert _chi2(first, p[0]) < CHI2_DF5_P001
    # Given the first token came from node 1 (token 2), the next follows the target at node 1.
    via1 = path[:, 1] == 1
    second = torch.where(accepted[via1] >= 2, tok_path[via1, 2], bonus[via1])
    assert via1.sum() > 1000 and _chi2(second, p[1]) < CHI2_DF5_P001
    # Acceptance is real: both children and the grandchild get accepted sometimes.
    assert (path[:, 1] == 2).any() and (accepted == 2).any()


def test_chain_rejection_sampling_matches_target_distribution():
    g = torch.Generator().manual_seed(1)
    p = _dists(g, 3)                                  # target at root, after d1, after d2
    q = _dists(g, 2)                                  # draft distributions for d1, d2
    d1 = spec.sample_from(q[0].expand(N_SAMPLES, V), torch.rand(N_SAMPLES, generator=g, dtype=torch.float64))
    d2 = spec.sample_from(q[1].expand(N_SAMPLES, V), torch.rand(N_SAMPLES, generator=g, dtype=torch.float64))
    drafts = torch.stack([d1, d2], 1)
    coins = torch.rand(N_SAMPLES, 3, generator=g, dtype=torch.float64)
    accepted, bonus = spec.verify_chain_rejection(drafts, q[None].expand(N_SAMPLES, 2, V),
                                                  p[None].expand(N_SAMPLES, 3, V), coins)
    first = torch.where(accepted >= 1, d1, bonus)
    assert _chi2(first, p[0]) < CHI2_DF5_P001
    ok1 = accepted >= 1
    second = torch.where(accepted[ok1] >= 2, d2[ok1], bonus[ok1])
    assert _chi2(second, p[1]) < CHI2_DF5_P001
    assert 0 < float(accepted.double().mean()) < 2


def test_sampling_probs_temperature_top_k_top_p():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]]).expand(4, 1, 4)
    p = spec.sampling_probs(logits, torch.tensor([0.0, 1.0, 1.0, 1.0]), torch.tensor([-1, -1, 2, -1]),
                            torch.tensor([1.0, 1.0, 1.0, 0.5], dtype=torch.float64))
    assert torch.equal(p[0, 0], torch.tensor([1.0, 0, 0, 0], dtype=p.dtype))    # greedy: one-hot
    torch.testing.assert_close(p[1, 0], torch.softmax(logits[0, 0].double(), -1).to(p.dtype))
    assert (p[2, 0, 2:] == 0).all() and abs(float(p[2, 0].sum()) - 1) < 1e-6    # top-k 2
    assert p[3, 0, 0] == 1                                                     # top-p 0.5 keeps one


def test_tree_meta_mask_and_positions():
    parents = torch.tensor([[-1, 0, 0, 1]])
    depth = torch.tensor([[0, 1, 1, 2]])
    meta = spec.tree_meta(torch.tensor([0]), torch.tensor([3]), parents, depth, ctx=8)
    assert meta.positions.tolist() == [[3, 4, 4, 5]] and meta.slots.tolist() == [[3, 4, 5, 6]]
    m = meta.mask[0].int().tolist()
    assert m[0] == [1, 1, 1, 1, 0, 0, 0, 0]     # root: prefix + itself
    assert m[2] == [1, 1, 1, 1, 0, 1, 0, 0]     # node 2: root + itself, not its sibling
    assert m[3] == [1, 1, 1, 1, 1, 0, 1, 0]     # node 3: root, parent 1, itself


def test_greedy_tree_walk_takes_longest_matching_path():
    tokens = torch.tensor([[9, 2, 4, 5, 1]])
    parents = torch.tensor([[-1, 0, 0, 2, 2]])
    logits = torch.zeros(1, 5, 10)
    logits[0, 0, 4] = 1     # root predicts 4 -> node 2
    logits[0, 2, 1] = 1     # node 2 predicts 1 -> node 4
    logits[0, 4, 7] = 1     # node 4 predicts 7: the bonus
    path, accepted, bonus = spec.verify_tree_greedy(tokens, parents, logits, steps=3)
    assert path.tolist() == [[0, 2, 4, -1]] and accepted.tolist() == [2] and bonus.tolist() == [7]


def test_chain_greedy_verify_equals_the_tree_walk():
    """The vectorised chain verification gives the tree walk's (path, accepted, bonus) on chains
    with every possible accept count, rejections in the middle, and a batch mixing them."""
    g = torch.Generator().manual_seed(11)
    for steps in (1, 3, 7):
        b, v = 64, 5
        logits = torch.randn(b, steps + 1, v, generator=g)
        predict = logits.argmax(-1)
        # Drafts equal the target's choice with probability 0.7 per position, else another token.
        agree = torch.rand(b, steps, generator=g) < 0.7
        drafts = torch.where(agree, predict[:, :-1], (predict[:, :-1] + 1) % v)
        tokens, parents, _ = spec.chain_tree(torch.randint(0, v, (b,), generator=g), drafts)
        want = spec.verify_tree_greedy(tokens, parents, logits, steps)
        got = spec.verify_chain_greedy(tokens, logits)
        for w, x in zip(want, got):
            assert torch.equal(w, x), (steps, w, x)
        assert set(got[1].tolist()) >= {0, steps} or steps == 7   # both extremes met (7: rarely all)
