"""The Llama target model (HF `LlamaForCausalLM` parameter names), with EAGLE-3 aux outputs.

`forward` returns the final-normed hidden states and the concatenated aux hidden states
[low, mid, high] of the layers EAGLE-3 fuses; `logits` applies the lm_head to the rows the caller
needs (the last prefill row, every verify row). No tensor parallelism in here (refengine.tp).
"""

from __future__ import annotations

import torch
from torch import nn

from refengine.models.configs import LlamaConfig
from refengine.models.fused_ops import add_rms_norm
from refengine.models.layers import MLP, Attention, AttnMeta, KVPool, RMSNorm, Rotary


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, rotary: Rotary):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads,
                                   cfg.num_key_value_heads, cfg.head_dim, rotary, cfg.attention_bias)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, delta: torch.Tensor | None, residual: torch.Tensor, meta: AttnMeta,
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream enters as (delta, residual) — the previous layer's MLP output not
        yet added — and leaves the same way: the add then shares a kernel with this layer's first
        norm (fused_ops.add_rms_norm; Inductor's fusion when compiled). Returns (MLP output,
        residual before it); their sum is the layer's output."""
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        h, residual = add_rms_norm(residual, delta, n1.weight, n1.eps)
        h, residual = add_rms_norm(residual, self.self_attn(h, meta, k_cache, v_cache), n2.weight, n2.eps)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self.rotary) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig, aux_layer_ids: tuple[int, ...] | None = None):
        """Args:
            aux_layer_ids: EAGLE-3 fused layers as *output-of-layer* ids, 0-indexed (the draft
                config's `eagle_aux_hidden_state_layer_ids`); default [1, L//2 - 1, L - 4].
                SGLang stores these +1 as "capture before layer i" ids (it takes the output of
                layer i-1 as the input of layer i); we capture the output of layer id directly,
                which is the same tensor.
        """
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.set_aux_layers(aux_layer_ids or cfg.default_aux_layers())

    def set_aux_layers(self, ids: tuple[int, ...]) -> None:
        n = self.config.num_hidden_layers
        if len(ids) != 3 or any(not 0 <= i < n for i in ids):
            raise ValueError(f"EAGLE-3 aux layer ids must be 3 ids in [0, {n}), got {list(ids)}")
        self.aux_layer_ids = tuple(int(i) for i in ids)

    def make_kv(self, rows: int, row_len: int, dtype: torch.dtype, device) -> KVPool:
        """A KV pool sized from the (possibly sharded) k_proj: kv heads are local after TP."""
        attn = self.model.layers[0].self_attn
        kv_heads = attn.k_proj.weight.shape[0] // attn.head_dim
        return KVPool(len(self.model.layers), rows, row_len, kv_heads, attn.head_dim, dtype, device)

    def forward(self, input_ids: torch.Tensor, meta: AttnMeta, kv: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
        """Run [B, T] tokens; returns (final-normed hidden [B, T, H], aux [B, T, 3H]).

        aux is the pre-norm residual stream after each fused layer, concatenated low, mid, high;
        after TP it is replicated on every rank (it follows an all-reduce), so feeding the draft
        needs no communication.
        """
        delta, residual = None, self.model.embed_tokens(input_ids)
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            delta, residual = layer(delta, residual, meta, kv.k[i], kv.v[i])
            if i in self.aux_layer_ids:
                captured[i] = residual + delta
        aux = torch.cat([captured[i] for i in self.aux_layer_ids], dim=-1)
        return self.model.norm(residual + delta), aux

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
