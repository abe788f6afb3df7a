"""Acceptance length τ of a target + EAGLE-3 head with chain drafting (topk = 1), by recomputation.

Used during training (a quick figure at the end of `train-tiny`); the published numbers come from the
engine's own speculative loop (benchmarks/tiny_model_tau.py). Semantics are the engine's
(eagle3.md §2.1, §2.4, §3.1–3.2), without a KV cache, so every forward recomputes the whole prefix:
* draft position p holds (target aux g_p, embedding of token p+1); a chain step feeds the head its
  own pre-norm output and its own previous token at position + 1, attending to the committed
  context and the chain so far;
* greedy: accept drafts while they equal the target argmax; the bonus is the target argmax after
  the last accepted one; τ = accepted + 1 per verify;
* temperature > 0: SGLang's target-only rule for a chain: accept draft d with probability p(d),
  on rejection sample from p with d removed, else sample the bonus from p.

Must not: be used where speed matters (it is O(length²) per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refengine.train import models
from refengine.train.ttt import apply_rope, rope_cos_sin


@dataclass
class ChainStats:
    verifies: int = 0
    committed: int = 0
    correct: int = 0

    @property
    def tau(self) -> float:
        return self.committed / self.verifies if self.verifies else float("nan")


def _head_layer(head, e, hidden, positions, k_cache, v_cache, shape):
    """One head forward over new rows; appends their K/V to the caches (lists of [nh, *, hd])."""
    layer, attn = head.midlayer, head.midlayer.self_attn
    n = e.shape[0]
    nh, nkv, hd = shape.num_heads, shape.num_kv_heads, shape.head_dim
    x = torch.cat([layer.input_layernorm(e), layer.hidden_norm(hidden)], dim=-1)
    q = attn.q_proj(x).view(n, nh, hd).transpose(0, 1)
    k = attn.k_proj(x).view(n, nkv, hd).transpose(0, 1).repeat_interleave(nh // nkv, dim=0)
    v = attn.v_proj(x).view(n, nkv, hd).transpose(0, 1).repeat_interleave(nh // nkv, dim=0)
    cos, sin = rope_cos_sin(positions, hd, shape.rope_theta)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    past = sum(c.shape[1] for c in k_cache)
    k_cache.append(k)
    v_cache.append(v)
    keys, vals = torch.cat(k_cache, dim=1), torch.cat(v_cache, dim=1)
    scores = (q @ keys.transpose(-1, -2)) / math.sqrt(hd)
    dev = e.device
    allowed = (torch.arange(keys.shape[1], device=dev)[None, :]
               <= (past + torch.arange(n, device=dev))[:, None])
    scores = scores.masked_fill(~allowed, float("-inf"))
    o = torch.softmax(scores.float(), dim=-1) @ vals
    h = hidden + attn.o_proj(o.transpose(0, 1).reshape(n, nh * hd))
    h = h + layer.mlp(layer.post_attention_layernorm(h))
    return head.lm_head(head.norm(h)), h


@torch.no_grad()
def draft_chain(head, embed, aux: torch.Tensor, tokens: torch.Tensor, steps: int, shape
                ) -> list[int]:
    """Greedy chain of `steps` draft tokens after `tokens` (aux covers tokens[:-1])."""
    dev = tokens.device
    used = torch.arange(head.d2t.numel(), device=dev) + head.d2t
    m = tokens.numel()
    k_cache: list[torch.Tensor] = []
    v_cache: list[torch.Tensor] = []
    logits, h = _head_layer(head, embed(tokens[1:]), head.fc(aux[: m - 1]),
                            torch.arange(m - 1, device=dev), k_cache, v_cache, shape)
    out = [int(used[logits[-1].argmax()])]
    hidden = h[-1:]
    for i in range(1, steps):
        logits, hidden = _head_layer(head, embed(torch.tensor([out[-1]], device=dev)), hidden,
                                     torch.tensor([m - 2 + i], device=dev), k_cache, v_cache,
                                     shape)
        out.append(int(used[logits[-1].argmax()]))
    return out


@torch.no_grad()
def generate_chain(target, head, head_config: dict, aux_ids: list[int], prompt: torch.Tensor,
                   new_tokens: int, steps: int, temperature: float = 0.0,
                   gen: torch.Generator | None = None) -> tuple[list[int], ChainStats]:
    """Speculative generation of at least `new_tokens` tokens; returns (tokens, stats)."""
    shape = models.head_attn_shape(head_config)
    embed = models.target_embedding(target)
    stats = ChainStats()

    def pick(logits: torch.Tensor) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        return int(torch.multinomial(torch.softmax(logits.float() / temperature, -1).cpu(), 1,
                                     generator=gen))

    logits, aux = models.target_forward(target, prompt[None], aux_ids)
    dev = prompt.device
    tokens = torch.cat([prompt, torch.tensor([pick(logits[0, -1])], device=dev)])
    aux = aux[0]
    start = prompt.numel()
    while tokens.numel() - start < new_tokens:
        drafts = draft_chain(head, embed, aux, tokens, steps, shape)
        window = torch.cat([tokens, torch.tensor(drafts, device=dev)])
        logits, aux_all = models.target_forward(target, window[None], aux_ids)
        logits = logits[0, tokens.numel() - 1:]
        accepted, bonus = 0, None
        for i, d in enumerate(drafts):
            if temperature <= 0:
                ok = int(logits[i].argmax()) == d
            else:
                p = torch.softmax(logits[i].float() / temperature, -1).cpu()  # coins on the CPU generator
                ok = torch.rand((), generator=gen).item() < p[d].item()
                if not ok:
                    p[d] = 0.0
                    bonus = int(torch.multinomial(p / p.sum(), 1, generator=gen))
            if not ok:
                break
            accepted += 1
        if bonus is None:
            bonus = pick(logits[accepted])
        tokens = torch.cat([tokens, torch.tensor(drafts[:accepted] + [bonus], device=dev)])
        aux = aux_all[0, : tokens.numel() - 1]
        stats.verifies += 1
        stats.correct += accepted
        stats.committed += accepted + 1
    return tokens[start:].tolist(), stats


def mean_tau(target, head, head_config: dict, aux_ids: list[int], prompts: list[torch.Tensor],
             new_tokens: int, steps: int, temperature: float = 0.0, seed: int = 0) -> float:
    """τ over all prompts (committed tokens / verifies), prompts on the models' device."""
    gen = torch.Generator().manual_seed(seed)
    dev = target.lm_head.weight.device
    prompts = [p.to(dev) for p in prompts]
    total = ChainStats()
    for p in prompts:
        _, s = generate_chain(target, head, head_config, aux_ids, p, new_tokens, steps,
                              temperature, gen)
        total.verifies += s.verifies
        total.committed += s.committed
    return total.tau
