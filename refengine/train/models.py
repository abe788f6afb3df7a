"""The engine's model classes as the trainer uses them: build by config dict, full causal forward.

The target and the head are the engine's own `LlamaForCausalLM` and `Eagle3Head`
(refengine.models), so what is trained is exactly what is served and `state_dict()` is the
checkpoint (HF Llama names; EAGLE-3 `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`). The
engine's forward writes K/V into a pool; for training a pool of one window per row is made per
call, which autograd follows like any other tensor.

Must not: hold training logic, or re-implement model layers.
"""

from __future__ import annotations

import torch
from torch import nn

from refengine.models.configs import Eagle3Config, LlamaConfig
from refengine.models.eagle3 import Eagle3Head
from refengine.models.layers import causal_meta
from refengine.models.llama import LlamaForCausalLM
from refengine.train.ttt import AttnShape


def _init_normal(module: nn.Module, std: float) -> None:
    # HF Llama's initialisation (normal(0, initializer_range), norms at one).
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)


def build_target(config: dict) -> LlamaForCausalLM:
    model = LlamaForCausalLM(LlamaConfig.from_dict(config))
    _init_normal(model, config.get("initializer_range", 0.02))
    return model


def target_forward(target: LlamaForCausalLM, ids: torch.Tensor, aux_layer_ids: list[int]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Full causal forward over [B, T] ids: (logits [B, T, V], aux [B, T, 3H]).

    aux = outputs (pre-final-norm residual stream) of the decoder layers `aux_layer_ids`
    (output-of-layer ids, 0-indexed), concatenated low, mid, high.
    """
    if tuple(aux_layer_ids) != target.aux_layer_ids:
        target.set_aux_layers(tuple(aux_layer_ids))
    B, T = ids.shape
    dtype = target.lm_head.weight.dtype
    kv = target.make_kv(B, T, dtype, ids.device)
    positions = torch.arange(T, device=ids.device).expand(B, T)
    meta = causal_meta(torch.arange(B, device=ids.device), positions, T)
    hidden, aux = target(ids, meta, kv)
    return target.logits(hidden), aux


def target_embedding(target: LlamaForCausalLM) -> nn.Module:
    return target.model.embed_tokens


def build_head(config: dict, target: LlamaForCausalLM | None = None) -> Eagle3Head:
    head = Eagle3Head(Eagle3Config.from_dict(config))
    _init_normal(head, config.get("initializer_range", 0.02))
    if target is not None:
        head.set_embed(target_embedding(target))
    return head


def head_attn_shape(config: dict) -> AttnShape:
    return AttnShape(config["num_attention_heads"], config["num_key_value_heads"],
                     config["head_dim"], float(config.get("rope_theta", 10000.0)))
