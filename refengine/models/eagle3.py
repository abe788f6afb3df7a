"""The EAGLE-3 draft head with the official checkpoint names: fc, midlayer.*, norm, lm_head, d2t, t2d.

One decoder layer whose attention reads [norm(embedding), norm(hidden)] (2H wide), fed either the
target's fused aux features (through fc) or its own previous pre-norm output. The token embedding
is the target's (shared, never stored here). Draft ids leave the head as target ids: id + d2t[id].
No tensor parallelism in here (refengine.tp).
"""

from __future__ import annotations

import torch
from torch import nn

from refengine.models.configs import Eagle3Config
from refengine.models.layers import MLP, Attention, AttnMeta, KVPool, RMSNorm, Rotary


class Eagle3MidLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config, rotary: Rotary):
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Attention(2 * h, h, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, rotary)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size)

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, meta: AttnMeta, kv: KVPool) -> torch.Tensor:
        residual = hidden
        # Order matters and is the checkpoint's: embedding first, then the hidden state.
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        h = residual + self.self_attn(x, meta, kv.k[0], kv.v[0])
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(3 * cfg.target_hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.midlayer = Eagle3MidLayer(cfg, self.rotary)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # d2t[i] = target_id - i (an offset, as the checkpoint stores it); t2d marks target ids in
        # the draft vocabulary (training only).
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self._embed: list[nn.Module] = []   # a list so the shared embedding is not a submodule

    def set_embed(self, embed: nn.Module) -> None:
        """Share the target's token embedding (SGLang's `set_embed`)."""
        self._embed = [embed]

    @property
    def embed(self) -> nn.Module:
        if not self._embed:
            raise RuntimeError("EAGLE-3 head has no embedding: call set_embed(target embedding) first")
        return self._embed[0]

    def make_kv(self, rows: int, row_len: int, dtype: torch.dtype, device) -> KVPool:
        attn = self.midlayer.self_attn
        kv_heads = attn.k_proj.weight.shape[0] // attn.head_dim
        return KVPool(1, rows, row_len, kv_heads, attn.head_dim, dtype, device)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, meta: AttnMeta,
                kv: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward over [B, T] target token ids.

        Args:
            hidden: [B, T, 3Ht] target aux features (fc applied) or [B, T, H] the draft's own
                pre-norm output of the parent token (fc skipped: the width already matches).
        Returns:
            (draft logits [B, T, draft_vocab], the hidden [B, T, H] to feed back next step: pre-norm,
            or normed with `norm_output`, as SGLang's llama_eagle3.py:264-269).
        """
        if hidden.shape[-1] != self.config.hidden_size:
            if self.config.norm_before_fc:
                hidden = self.input_norm(hidden)
            hidden = self.fc(hidden)
        out = self.midlayer(self.embed(input_ids), hidden, meta, kv)
        normed = self.norm(out)
        return self.lm_head(normed), (normed if self.config.norm_output else out)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
