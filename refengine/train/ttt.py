"""EAGLE-3 training-time test (TTT): the K-step unrolled head forward and its loss.

Follows the reference trainers (EAGLE `traineagle3/cnets.py`, SpecForge `eagle3/model.py`):
* step k feeds, at position t, the token x_{t+1+k} and (for k > 0) the head's own pre-norm output of
  step k-1 at the same t; step 0 feeds fc(aux features g_t);
* the query of step k at t attends causally to the step-0 keys 0..t (the real-feature context) plus
  the diagonal keys of steps 1..k at t (its own predicted chain); one softmax over both; RoPE
  position t + k for the queries and keys of step k;
* loss_k = soft cross-entropy of the draft logits against softmax(target logits restricted to the
  draft vocabulary), on positions whose target argmax is in the draft vocabulary; total Σ 0.8^k loss_k.

The head's own modules (fc, midlayer.*, norm, lm_head) are used; only the attention pattern is
written here, because inference attends through a KV cache and training needs the TTT mask.

Must not: touch optimisers or data loading, or change the head's parameters' names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOSS_DECAY = 0.8


@dataclass(frozen=True)
class AttnShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """HF Llama's (rotate_half) RoPE tables for integer positions [T] -> [T, head_dim]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                        dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def shift_left(x: torch.Tensor, n: int, fill: float | int = 0) -> torch.Tensor:
    """x[:, t] <- x[:, t + n] along dim 1, the tail filled (those positions are masked out)."""
    if n == 0:
        return x
    pad = x.new_full((x.shape[0], n, *x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_unroll(head, embed: torch.nn.Module, aux: torch.Tensor, ids: torch.Tensor, steps: int,
               shape: AttnShape) -> list[torch.Tensor]:
    """Run `steps` TTT steps; return the draft logits [B, T, Dv] of each step.

    `aux` is the concatenated target features [B, T, 3*Ht] at positions 0..T-1 of `ids` [B, T].
    """
    B, T = ids.shape
    nh, nkv, hd = shape.num_heads, shape.num_kv_heads, shape.head_dim
    layer, attn = head.midlayer, head.midlayer.self_attn
    hidden = head.fc(aux)
    base_pos = torch.arange(T, device=ids.device)
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    scale = 1.0 / math.sqrt(hd)
    k0 = v0 = None
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    out_logits = []
    for k in range(steps):
        with torch.no_grad():  # the embedding is the target's, shared and frozen
            e = embed(shift_left(ids, k + 1))
        residual = hidden
        x = torch.cat([layer.input_layernorm(e), layer.hidden_norm(hidden)], dim=-1)
        q = attn.q_proj(x).view(B, T, nh, hd).transpose(1, 2)
        kk = attn.k_proj(x).view(B, T, nkv, hd).transpose(1, 2)
        v = attn.v_proj(x).view(B, T, nkv, hd).transpose(1, 2)
        cos, sin = rope_cos_sin(base_pos + k, hd, shape.rope_theta)
        q, kk = apply_rope(q, cos, sin), apply_rope(kk, cos, sin)
        kk = kk.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        if k == 0:
            k0, v0 = kk, v
        else:
            diag_k.append(kk)
            diag_v.append(v)
        s0 = (q @ k0.transpose(-1, -2)) * scale
        s0 = s0.masked_fill(~causal, float("-inf"))
        sd = [(q * dk).sum(-1, keepdim=True) * scale for dk in diag_k]
        probs = torch.softmax(torch.cat([s0, *sd], dim=-1).float(), dim=-1).to(q.dtype)
        o = probs[..., :T] @ v0
        for j, dv in enumerate(diag_v):
            o = o + probs[..., T + j:T + j + 1] * dv
        h = residual + attn.o_proj(o.transpose(1, 2).reshape(B, T, nh * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        out_logits.append(head.lm_head(head.norm(h)))
        hidden = h  # the pre-norm output feeds the next step (EAGLE-3 §3.1)
    return out_logits


@dataclass
class TTTLoss:
    total: torch.Tensor
    per_step: list[float]
    acc: list[float]


def ttt_loss(draft_logits: list[torch.Tensor], target_logits: torch.Tensor, d2t: torch.Tensor,
             t2d: torch.Tensor, loss_mask: torch.Tensor | None = None) -> TTTLoss:
    """Σ_k 0.8^k soft-CE(draft_k, softmax(target restricted to the draft vocab)).

    `target_logits` [B, T, V] are the target's logits at positions 0..T-1 (z_t predicts x_{t+1});
    draft position t at step k is supervised by z_{t+1+k}. `loss_mask` [B, T] (1 = a real token)
    defaults to all ones.
    """
    B, T, _ = target_logits.shape
    used = torch.arange(d2t.numel(), device=d2t.device) + d2t
    if loss_mask is None:
        loss_mask = torch.ones(B, T, device=target_logits.device)
    total = target_logits.new_zeros((), dtype=torch.float32)
    per_step, acc = [], []
    for k, logits in enumerate(draft_logits):
        z = shift_left(target_logits, k + 1)
        valid = shift_left(loss_mask, k + 1)
        z_arg = z.argmax(-1)
        pmask = valid * t2d[z_arg].to(valid.dtype)
        target_p = torch.softmax(z[..., used].float(), dim=-1)
        logp = torch.log_softmax(logits.float(), dim=-1)
        n = pmask.sum().clamp(min=1.0)
        ploss = -(pmask * (target_p * logp).sum(-1)).sum() / n
        total = total + (LOSS_DECAY ** k) * ploss
        with torch.no_grad():
            hit = (used[logits.argmax(-1)] == z_arg).float()
            acc.append(((hit * valid).sum() / valid.sum().clamp(min=1.0)).item())
        per_step.append(ploss.item())
    return TTTLoss(total, per_step, acc)

