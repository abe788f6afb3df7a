"""The EAGLE-3 draft vocabulary and its d2t / t2d buffers, from token frequencies.

As EAGLE-3 and SpecForge do it: the `draft_vocab_size` most frequent target ids, sorted ascending by
target id (zero-frequency ids 0.. pad the set when fewer distinct ids occur); `d2t[i] = used[i] - i`
(so target id = draft id + d2t[draft id]) and `t2d[j] = j in used`.

Must not: depend on the model classes.
"""

from __future__ import annotations

import torch


def token_counts(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(tokens.reshape(-1), minlength=vocab_size)[:vocab_size]


def draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (d2t int64[draft_vocab_size], t2d bool[vocab])."""
    vocab = counts.numel()
    if not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size must be in 1..{vocab}, got {draft_vocab_size}")
    # Stable sort by descending count keeps ties in ascending id order, so the choice is reproducible;
    # zero-count ids come last in id order, which is SpecForge's padding.
    order = torch.sort(-counts, stable=True).indices
    used = torch.sort(order[:draft_vocab_size]).values
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return d2t.to(torch.int64), t2d


def used_ids(d2t: torch.Tensor) -> torch.Tensor:
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    total = counts.sum().item()
    return counts[t2d].sum().item() / total if total else 0.0
