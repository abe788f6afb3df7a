"""Shapes of the tiny target and its EAGLE-3 head, and the config.json files they are saved with.

The target is a standard HF Llama config; the head is an EAGLE-3 head config as the official
Llama-3.1-8B head's (eagle3.md §1.5) plus `target_hidden_size`, `rope_theta` and `eagle_config`
(aux layer ids as output-of-layer ids, the SpecForge/SGLang convention).

Must not: import the model classes (the configs are plain data).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from refengine.train.byte_tokenizer import EOS_ID, VOCAB_SIZE


@dataclass(frozen=True)
class TinyShape:
    layers: int = 8
    hidden: int = 192
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    head_intermediate: int = 512
    draft_vocab: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.layers < 8:
            # [1, L//2-1, L-4] are distinct and ordered only from L = 8 (eagle3.md §1.1).
            raise ValueError(f"the target needs at least 8 layers, got {self.layers}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden must divide by heads and heads by kv_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def aux_layer_ids(self) -> list[int]:
        return [1, self.layers // 2 - 1, self.layers - 4]

    def to_dict(self) -> dict:
        return asdict(self)


def target_config(shape: TinyShape) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def head_config(shape: TinyShape) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "target_hidden_size": shape.hidden,
        "intermediate_size": shape.head_intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": shape.rms_norm_eps,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "vocab_size": VOCAB_SIZE,
        "draft_vocab_size": shape.draft_vocab,
        "tie_word_embeddings": False,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": shape.aux_layer_ids,
            "use_aux_hidden_state": True,
        },
    }
