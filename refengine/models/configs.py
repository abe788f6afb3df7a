"""Model shapes read from Hugging Face `config.json` dicts: the Llama target and the EAGLE-3 head.

Field names are the checkpoint's own. Must not import torch (the HTTP process reads these too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    torch_dtype: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        # transformers >= 5 writes rope settings under `rope_parameters`; older files use
        # `rope_theta` + `rope_scaling`. Accept both.
        rope = d.get("rope_parameters") or {}
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling")
        if scaling is None and rope.get("rope_type", "default") not in ("default", None):
            scaling = dict(rope)
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-5), rope_theta=float(theta), rope_scaling=scaling,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            eos_token_ids=eos_ids, bos_token_id=d.get("bos_token_id"), torch_dtype=d.get("torch_dtype"),
        )

    def to_dict(self) -> dict[str, Any]:
        """An HF-style config.json for this shape (what `save_pretrained` would write)."""
        d: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
            "tie_word_embeddings": self.tie_word_embeddings, "attention_bias": self.attention_bias,
            "torch_dtype": self.torch_dtype or "float32",
        }
        if self.rope_scaling:
            d["rope_scaling"] = self.rope_scaling
        if self.eos_token_ids:
            d["eos_token_id"] = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_ids[0]
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        return d

    def default_aux_layers(self) -> tuple[int, int, int]:
        """EAGLE-3's fused layers as output-of-layer ids (0-indexed): [1, L//2 - 1, L - 4]."""
        n = self.num_hidden_layers
        return (1, n // 2 - 1, n - 4)


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    num_hidden_layers: int = 1
    aux_layer_ids: tuple[int, ...] | None = None
    """eagle_config.eagle_aux_hidden_state_layer_ids: output-of-layer ids (None = the default)."""
    norm_before_fc: bool = False
    tie_word_embeddings: bool = False
    norm_output: bool = False
    """Feed the normed hidden state back to the next draft step instead of the pre-norm one."""
    lm_head_source: str = "own"
    """Where the draft's lm_head comes from, as SGLang decides (llama_eagle3.py:300-314,
    eagle_worker_v2.py:352-363): "own" (the checkpoint's, draft_vocab_size rows),
    "target_lm_head" (no draft_vocab_size: the target's lm_head) or "target_embedding"
    (tie_word_embeddings: the lm_head is the embedding, which is the target's)."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Eagle3Config":
        heads = d["num_attention_heads"]
        eagle = d.get("eagle_config") or {}
        for unsupported in ("fc_norm", "use_aux_norm"):
            if d.get(unsupported):
                raise ValueError(f"EAGLE-3 head option {unsupported!r} is not supported by this engine")
        if d.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"EAGLE-3 heads with num_hidden_layers != 1 are not supported "
                             f"(got {d.get('num_hidden_layers')})")
        if not eagle.get("use_aux_hidden_state", True):
            raise ValueError("eagle_config.use_aux_hidden_state = false is not supported")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        # SGLang sizes fc by the aux count (llama_eagle3.py:160-166: num_aux_hidden_states, else the
        # layer ids' count, else 3); this engine captures exactly 3 target layers.
        n_aux = d.get("num_aux_hidden_states") or (len(ids) if ids else 3)
        if n_aux != 3:
            raise ValueError(f"EAGLE-3 heads over {n_aux} target layers are not supported by this engine "
                             "(it feeds exactly 3 aux hidden states; SGLang loads any count)")
        target_hidden = d.get("target_hidden_size") or d["hidden_size"]
        if target_hidden != d["hidden_size"]:
            # SGLang then keeps the head's own embedding instead of sharing the target's
            # (models/llama.py:910-916); this engine always shares the target's.
            raise ValueError(f"EAGLE-3 heads with target_hidden_size ({target_hidden}) != hidden_size "
                             f"({d['hidden_size']}) are not supported by this engine (it shares the "
                             "target's embedding; SGLang keeps the head's own)")
        rope = d.get("rope_parameters") or {}
        tied = bool(d.get("tie_word_embeddings", False))
        source = "target_embedding" if tied else ("target_lm_head" if d.get("draft_vocab_size") is None else "own")
        return cls(
            hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            vocab_size=d["vocab_size"],
            draft_vocab_size=d["vocab_size"] if source != "own" else d["draft_vocab_size"],
            target_hidden_size=target_hidden,
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=float(d.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rope_scaling=d.get("rope_scaling"),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            aux_layer_ids=tuple(ids) if ids else None,
            norm_before_fc=bool(eagle.get("norm_before_fc", d.get("norm_before_fc", False))),
            tie_word_embeddings=tied, norm_output=bool(d.get("norm_output", False)),
            lm_head_source=source, raw=dict(d),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.lm_head_source == "target_lm_head":
            del d["draft_vocab_size"]  # its absence is what says "use the target's lm_head"
        if self.norm_output:
            d["norm_output"] = True
        if self.rope_scaling:
            d["rope_scaling"] = self.rope_scaling
        eagle: dict[str, Any] = {"use_aux_hidden_state": True}
        if self.aux_layer_ids is not None:
            eagle["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
        if self.norm_before_fc:
            eagle["norm_before_fc"] = True
        d["eagle_config"] = eagle
        return d
