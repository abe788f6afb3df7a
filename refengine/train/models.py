"""The models the trainer builds: the Llama target and the EAGLE-3 head, by config dict.

Everything the trainer needs from a model goes through these four functions, so the classes behind
them can change without touching the training loops:
  build_target(config) / target_forward(target, ids) -> (logits, aux)
  build_head(config)   / head_attn_shape(config)
Parameter names are the checkpoint names (HF Llama; EAGLE-3 `fc`, `midlayer.*`, `norm`, `lm_head`,
`d2t`, `t2d`), so `state_dict()` is what is saved.

Must not: hold training logic.
"""

from __future__ import annotations

import torch
from torch import nn

from refengine.train.ttt import AttnShape


def build_target(config: dict) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures",)})
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def target_forward(target: nn.Module, ids: torch.Tensor, aux_layer_ids: list[int]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Full causal forward over [B, T] ids: (logits [B, T, V], aux [B, T, 3H]).

    aux = outputs (pre-final-norm residual stream) of the decoder layers `aux_layer_ids`, 0-indexed;
    in HF's `hidden_states` tuple index 0 is the embedding, so layer i's output is at i + 1.
    """
    out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1)
    return out.logits, aux


def target_embedding(target: nn.Module) -> nn.Module:
    return target.get_input_embeddings()


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class _MidLayer(nn.Module):
    def __init__(self, config: dict) -> None:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        h, eps = config["hidden_size"], config["rms_norm_eps"]
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = _Attention(h, config["num_attention_heads"],
                                    config["num_key_value_heads"], config["head_dim"])
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(LlamaConfig(hidden_size=h, intermediate_size=config["intermediate_size"],
                                        hidden_act="silu", mlp_bias=False))


class _Eagle3Head(nn.Module):
    def __init__(self, config: dict) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()
        h = config["hidden_size"]
        th = config.get("target_hidden_size", h)
        self.fc = nn.Linear(3 * th, h, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config["rms_norm_eps"])
        self.lm_head = nn.Linear(h, config["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(config["draft_vocab_size"], dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config["vocab_size"], dtype=torch.bool))


def build_head(config: dict) -> nn.Module:
    head = _Eagle3Head(config)
    for m in head.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=config.get("initializer_range", 0.02))
    return head


def head_attn_shape(config: dict) -> AttnShape:
    return AttnShape(config["num_attention_heads"], config["num_key_value_heads"],
                     config["head_dim"], float(config.get("rope_theta", 10000.0)))
