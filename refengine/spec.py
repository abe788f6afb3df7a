"""The speculative steps of one decode iteration, as short tensor functions (gpt-fast style).

Alignment (EAGLE-3 §2.1): draft position p holds (target feature g_p, embedding of x_{p+1}) and
predicts x_{p+2}. With seq_len = n committed tokens in the target KV and the root x_n (the last
bonus) not yet in it:
  draft:        step 1's token d1 comes from the previous extend; step i >= 2 feeds d_{i-1} at
                position n + i - 2 with the draft's own previous pre-norm output as hidden;
  verify:       the target runs [x_n, d1..ds] at positions n..n+s;
  verify_sample: accept the longest prefix where d_{i+1} == argmax at i; bonus = argmax at the
                last accepted row (τ = accepted + 1);
  draft_extend: the draft re-runs N rows per request (SGLang spec-v2): ids = the target's
                predictions [d1..dj, bonus, garbage...], hidden = target aux of [x_n, d1..],
                positions n..n+N-1; row j's output seeds the next cycle. Rows past j write draft
                KV beyond the committed length, which nothing can see and the next cycle overwrites.
Functions take fixed-shape tensors and return tensors; bookkeeping is refengine.engine's.
"""

from __future__ import annotations

import torch

from refengine.models.eagle3 import Eagle3Head
from refengine.models.layers import KVPool, causal_meta


def draft_chain(head: Eagle3Head, kv: KVPool, rows: torch.Tensor, seq_lens: torch.Tensor,
                first: torch.Tensor, hidden: torch.Tensor, steps: int, ctx: int,
                on_step=None) -> torch.Tensor:
    """Greedy chain of `steps` draft tokens (target ids) per request: [B, steps].

    Only steps - 1 draft forwards run: the first token came from the previous extend.
    """
    tokens = [first]
    h = hidden[:, None]
    for i in range(1, steps):
        positions = (seq_lens + i - 1)[:, None]
        if on_step is not None:
            on_step(i)
        logits, h = head(tokens[-1][:, None], h, causal_meta(rows, positions, ctx), kv)
        tokens.append(head.to_target_ids(logits[:, -1].argmax(-1)))
    return torch.stack(tokens, dim=1)


def verify_greedy(draft_tokens: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain acceptance at temperature 0.

    Args:
        draft_tokens: [B, s]; logits: [B, s + 1, V] of the target over [root, d1..ds].
    Returns:
        (predict [B, s + 1] = the target's argmax at every row, accepted [B] = number of leading
        drafts equal to the target's prediction before them). Committed this cycle: the root and
        the accepted drafts; the bonus predict[accepted] is the next root.
    """
    predict = logits.argmax(-1)
    match = (draft_tokens == predict[:, :-1]).to(torch.int32)
    accepted = match.cumprod(dim=1).sum(dim=1)
    return predict, accepted


def draft_extend(head: Eagle3Head, kv: KVPool, rows: torch.Tensor, start: torch.Tensor,
                 ids: torch.Tensor, aux: torch.Tensor, select: torch.Tensor, ctx: int,
                 topk: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the draft over [B, T] rows at positions start..start+T-1 and read row `select` [B].

    Returns (hidden [B, H], first tokens [B, topk] as target ids, their probabilities [B, topk]).
    """
    t = ids.shape[1]
    positions = start[:, None] + torch.arange(t, device=ids.device)[None]
    logits, out = head(ids, aux, causal_meta(rows, positions, ctx), kv)
    b = torch.arange(ids.shape[0], device=ids.device)
    last = logits[b, select]
    if topk == 1:
        # Chain: argmax, with score 1 (SGLang's topk=1 path).
        first = last.argmax(-1, keepdim=True)
        p = torch.ones(first.shape, dtype=torch.float32, device=ids.device)
    else:
        p, first = torch.softmax(last.float(), -1).topk(topk, dim=-1)
    return out[b, select], head.to_target_ids(first), p
