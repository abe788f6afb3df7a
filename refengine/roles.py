"""The two roles of one decode iteration, chosen once per configuration: the Drafter proposes the
draft tree, the Verifier decides each request's accepted path and bonus token.

    roles_for(steps, topk, simulated) -> Roles(drafter, verifier)

    steps 0 (SGLang's tier 0)  no drafter            TierZeroVerifier (a one-token verify)
    topk 1                     ChainDrafter          ChainVerifier     (SimulatedChainVerifier)
    topk > 1                   TreeDrafter           TreeVerifier      (SimulatedTreeVerifier)

The roles hold no state: the engine passes itself (`e`: its draft placement, graph cache, head
stand-ins and host-to-device copies) and the iteration's tensors. Under `--speculative-adaptive`
each tier's steps picks its roles the same way. What varies per iteration rather than per
configuration stays an argument: whether any request samples, and whether the chain is drafted by
sampling for rejection sampling.

Must not read the device (a read is a sync: refengine.engine reads once per iteration) nor decide
what runs (refengine.engine does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from refengine import spec
from refengine.graphs import graphed_chain

if TYPE_CHECKING:
    from refengine.engine import Engine

Tensor = torch.Tensor


class ChainDrafter:
    """topk 1: a chain of `steps` drafts, greedy through the graph cache's chain (one replay a
    step, whatever the graph mode), or sampled with its draft probabilities q for rejection."""

    def draft(self, e: "Engine", cfg, reqs, rows: Tensor, seq: Tensor, roots: Tensor, temps: Tensor | None,
              ctx: int, rejection: bool) -> tuple[Tensor, Tensor | None]:
        d, s = e.draft, cfg.steps
        first_logits, hidden = d.logits[rows], d.hidden[rows]
        q = None
        if rejection:
            coins = e._to_dev(torch.stack([r.draft_gen_draw(s) for r in reqs]))
            drafts, q = spec.draft_chain_sample(e._head("draft_step"), d.kv, rows, seq, first_logits, hidden, s, ctx,
                                                temps, coins, e.target.config.vocab_size)
        else:
            # spec.draft_chain stays the tests' independent reference for this path.
            first = d.head.to_target_ids(first_logits.argmax(-1))
            g = e._head("draft_step")
            drafts = graphed_chain(e.graphs, g.placement, g.scope, d.head, d.kv, rows, seq, first,
                                   hidden, s, ctx, e.pad_row, e.chain_tail)
        return torch.stack(spec.chain_tree(roots, drafts), 1), q


class TreeDrafter:
    """topk > 1: SGLang's tree of `num_draft_tokens` nodes, `steps` levels deep."""

    def draft(self, e: "Engine", cfg, reqs, rows: Tensor, seq: Tensor, roots: Tensor, temps: Tensor | None,
              ctx: int, rejection: bool) -> tuple[Tensor, None]:
        d = e.draft
        tree = spec.draft_tree(e._head("draft_step"), d.kv, rows, seq, roots, d.logits[rows], d.hidden[rows],
                               cfg.steps, cfg.topk, cfg.num_draft_tokens, ctx)
        return torch.stack(tree, 1), None


def _sampled_rows(greedy: tuple[Tensor, Tensor, Tensor], sampled: tuple[Tensor, Tensor, Tensor],
                  temps: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per request: the sampled decision where its temperature is > 0, else the greedy one."""
    pick = temps > 0
    return (torch.where(pick[:, None], sampled[0], greedy[0]), torch.where(pick, sampled[1], greedy[1]),
            torch.where(pick, sampled[2], greedy[2]))


def _bonus(logits: Tensor, probs: Tensor | None, coins: Tensor | None, temps: Tensor | None, at: Tensor,
           coin: int) -> Tensor:
    """The target's token after node `at` [B]: argmax, or a sample where the request samples."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    bonus = logits[rows, at].argmax(-1)
    if probs is not None:
        bonus = torch.where(temps > 0, spec.sample_from(probs[rows, at], coins[:, coin]), bonus)
    return bonus


class TierZeroVerifier:
    """Steps 0: the root alone is verified; the bonus is the target's next token."""

    def decide(self, e, tokens, parents, logits, probs, coins, temps, q, rejection, s):
        b, dev = tokens.shape[0], tokens.device
        zero = torch.zeros(b, dtype=torch.long, device=dev)
        return zero[:, None], zero, _bonus(logits, probs, coins, temps, zero, 0)


class ChainVerifier:
    """A chain: greedy (the longest prefix the target agrees with), per-row sampling (the tree
    rule on a chain) or, with --speculative-use-rejection-sampling, rejection sampling."""

    def decide(self, e, tokens, parents, logits, probs, coins, temps, q, rejection, s):
        if rejection:
            accepted, bonus = spec.verify_chain_rejection(tokens[:, 1:], q, probs, coins)
            return spec.chain_path(accepted, s + 1), accepted, bonus
        greedy = spec.verify_chain_greedy(tokens, logits)
        if probs is None:
            return greedy
        return _sampled_rows(greedy, spec.verify_tree_sample(tokens, parents, probs, coins, s), temps)


class TreeVerifier:
    """A tree: greedy (follow the child the target picked) or per-row sampling."""

    def decide(self, e, tokens, parents, logits, probs, coins, temps, q, rejection, s):
        greedy = spec.verify_tree_greedy(tokens, parents, logits, s)
        if probs is None:
            return greedy
        return _sampled_rows(greedy, spec.verify_tree_sample(tokens, parents, probs, coins, s), temps)


def _drawn_depth(e, tokens: Tensor, s: int) -> Tensor:
    """How many drafts count as accepted, drawn from each row's curve (the engine's `sim_alphas`,
    set for this iteration; seeded: the same draw on every rank)."""
    u = torch.rand(tokens.shape[0], s, generator=e.sim_gen)
    ok = e._to_dev(u < e.sim_alphas.to(u.dtype))
    return ok.to(torch.int32).cumprod(1).sum(1)


class SimulatedChainVerifier:
    """The acceptance simulator on a chain: all compute ran; the drawn depth is accepted exactly
    (no walk: its per-level ops would be host time a real engine does not spend). Output tokens
    are then the drafts, not the target's choice."""

    def decide(self, e, tokens, parents, logits, probs, coins, temps, q, rejection, s):
        accepted = _drawn_depth(e, tokens, s).long()
        return spec.chain_path(accepted, s + 1), accepted, _bonus(logits, probs, coins, temps, accepted, s)


class SimulatedTreeVerifier:
    """The simulator on a tree: follow the child with the deepest subtree, so the walk reaches the
    drawn depth when it can (a tree shallower than the draw caps it: then τ falls short)."""

    def decide(self, e, tokens, parents, logits, probs, coins, temps, q, rejection, s):
        want = _drawn_depth(e, tokens, s)
        height = spec.subtree_height(parents, s)

        def deepest(d, cur, ch):
            h = torch.where(ch, height, torch.full_like(height, -1))
            return ch & (h == h.max(1, keepdim=True).values) & (d <= want)[:, None]
        path, accepted, cur = spec._walk(tokens, parents, s, None, deepest)
        return path, accepted, _bonus(logits, probs, coins, temps, cur, s)


class Roles(NamedTuple):
    drafter: ChainDrafter | TreeDrafter | None
    verifier: object


_ROLES = {
    # (tier 0, tree, simulated)
    (True, False, False): Roles(None, TierZeroVerifier()),
    (False, False, False): Roles(ChainDrafter(), ChainVerifier()),
    (False, True, False): Roles(TreeDrafter(), TreeVerifier()),
    (False, False, True): Roles(ChainDrafter(), SimulatedChainVerifier()),
    (False, True, True): Roles(TreeDrafter(), SimulatedTreeVerifier()),
}


def roles_for(steps: int, topk: int, simulated: bool) -> Roles:
    """The roles of a configuration (tier 0 verifies the root alone, simulated or not)."""
    if steps == 0:
        return _ROLES[(True, False, False)]
    return _ROLES[(False, topk > 1, simulated)]
