"""Named model shapes for `--model-path <preset> --load-format dummy`, and the "agreeing" tiny pair.

Presets: `tiny` (random weights), `tiny-agreeing` (constructed weights whose draft agrees with the
target most of the time, so acceptance is real on a CPU with no training or download),
`tiny-agreeing-tp8` (the same construction with 8 attention and 8 KV heads, so every placement
shards at TP 8), `llama-small` (a 57M-parameter Llama shape, random weights: on a CPU its forward grows
with batch × draft tokens, as the 8B's does on a GPU at high batch, where `tiny`'s is per-call cost), and
`llama-3.1-8b` (Llama-3.1-8B's shape, random weights, for timing on GPUs). Each comes with a
matching EAGLE-3 head (`<preset>-eagle3`, the official 8B head's shape for the 8B preset).
Weights are a deterministic function of the preset name and seed, so every rank builds the same.
"""

from __future__ import annotations

import math

import torch

from refengine.models.configs import Eagle3Config, LlamaConfig
from refengine.models.eagle3 import Eagle3Head
from refengine.models.llama import LlamaForCausalLM

TARGETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                        max_position_embeddings=2048, eos_token_ids=(0,)),
    "tiny-agreeing": LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256,
                                 num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=4096,
                                 eos_token_ids=(127,)),
    "tiny-agreeing-tp8": LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256,
                                     num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                                     head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=4096,
                                     eos_token_ids=(127,)),
    "llama-small": LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                               num_attention_heads=8, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
                               max_position_embeddings=4096, eos_token_ids=(2,), bos_token_id=1),
    "llama-3.1-8b": LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        eos_token_ids=(128001, 128008, 128009), bos_token_id=128000, torch_dtype="bfloat16"),
}

HEADS: dict[str, Eagle3Config] = {
    "tiny-eagle3": Eagle3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, vocab_size=256, draft_vocab_size=128,
                                target_hidden_size=64, rms_norm_eps=1e-6),
    "tiny-agreeing-eagle3": Eagle3Config(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=32, vocab_size=128,
                                         draft_vocab_size=64, target_hidden_size=128, rms_norm_eps=1e-6,
                                         max_position_embeddings=4096),
    "tiny-agreeing-tp8-eagle3": Eagle3Config(hidden_size=128, intermediate_size=256, num_attention_heads=8,
                                             num_key_value_heads=8, head_dim=16, vocab_size=128,
                                             draft_vocab_size=64, target_hidden_size=128, rms_norm_eps=1e-6,
                                             max_position_embeddings=4096),
    "llama-small-eagle3": Eagle3Config(hidden_size=512, intermediate_size=1536, num_attention_heads=8,
                                       num_key_value_heads=2, head_dim=64, vocab_size=32000, draft_vocab_size=8192,
                                       target_hidden_size=512, rms_norm_eps=1e-5, max_position_embeddings=4096),
    "llama-3.1-8b-eagle3": Eagle3Config(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                        num_key_value_heads=8, head_dim=128, vocab_size=128256,
                                        draft_vocab_size=32000, target_hidden_size=4096, rms_norm_eps=1e-5),
}


def is_preset(name: str) -> bool:
    return name in TARGETS or name in HEADS


def matching_head(target_preset: str) -> str | None:
    name = f"{target_preset}-eagle3"
    return name if name in HEADS else None


def _random_(module: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Normal(0, std) for matrices, ones for norms; deterministic for a device type and seed
    (drawn where the parameters live, so an 8B preset initialises on the GPU in seconds)."""
    gen = None
    with torch.no_grad():
        for name, p in module.named_parameters():
            if gen is None:
                gen = torch.Generator(device=p.device).manual_seed(seed)
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)


def build_target(name: str, seed: int = 0, device: str | torch.device = "cpu") -> LlamaForCausalLM:
    if name not in TARGETS:
        raise ValueError(f"unknown target preset {name!r}; presets: {', '.join(TARGETS)}")
    if name in AGREEING:
        return _agreeing_pair(seed, name, noise=AGREEING[name])[0]
    with torch.device(device):
        model = LlamaForCausalLM(TARGETS[name])
    _random_(model, seed)
    return model


def build_head(name: str, seed: int = 0, device: str | torch.device = "cpu") -> Eagle3Head:
    if name not in HEADS:
        raise ValueError(f"unknown EAGLE-3 head preset {name!r}; presets: {', '.join(HEADS)}")
    base = name.removesuffix("-eagle3")
    if base in AGREEING:
        return _agreeing_pair(seed, base, noise=AGREEING[base])[1]
    with torch.device(device):
        head = Eagle3Head(HEADS[name])
    _random_(head, seed + 1)
    cfg = head.config
    # Hot ids spread evenly over the target vocabulary, ascending, as d2t offsets.
    hot = torch.linspace(0, cfg.vocab_size - 1, cfg.draft_vocab_size).long().to(head.d2t.device)
    head.d2t.copy_(hot - torch.arange(cfg.draft_vocab_size, device=hot.device))
    head.t2d.zero_()
    head.t2d[hot] = True
    return head


# Agreeing presets and their layer noise. With 4 layers instead of 8, the TP8 variant needs more
# noise for the context to push the target off the cycle now and then (drafts then get rejected).
AGREEING = {"tiny-agreeing": 0.7, "tiny-agreeing-tp8": 0.9}


def _agreeing_pair(seed: int, name: str = "tiny-agreeing", noise: float = 0.7, head_noise: float = 0.4,
                   margin: float = 6.0) -> tuple[LlamaForCausalLM, Eagle3Head]:
    """A target that mostly follows a fixed token cycle π, perturbed by its context, and a head
    that knows π: its acceptance is high but not total, and depends on both KV caches.

    Construction (V = H, embeddings = rows of a random orthogonal matrix Q scaled by `a`):
    * target: the residual stream starts as a·q_x; every layer has random weights of scale
      `noise`, so attention over the context perturbs it; lm_head row t = c·q_{π⁻¹(t)}, so the
      argmax is π(x) unless the context pushes another token past the margin;
    * head: fc copies the `high` aux chunk (≈ a·q_x of the token at that position); its MLP is a
      lookup table mapping state q_y to q_{π(y)} (gate/up detect y, down writes q_{π(y)} − q_y);
      lm_head row j = c·q_{π⁻¹(hot_j)}. So each draft step advances the state by one π step and
      predicts π of it, exactly what the unperturbed target would do; its attention is random
      (scale `noise`) so the draft KV matters too.
    The draft vocabulary is the even ids (d2t[j] = j), and π cycles through them; odd ids follow
    no rule (the target's lm_head rows for them are random).
    """
    tcfg, hcfg = TARGETS[name], HEADS[f"{name}-eagle3"]
    v, h = tcfg.vocab_size, tcfg.hidden_size
    gen = torch.Generator().manual_seed(1234 + seed)
    q, _ = torch.linalg.qr(torch.randn(h, h, generator=gen, dtype=torch.float64))
    q = q[:v]                                           # [V, H], orthonormal rows
    hot = torch.arange(0, v, 2)
    cycle = hot[torch.randperm(len(hot), generator=gen)]
    pi = torch.arange(v)                               # odd ids: no rule (the head keeps them)
    pi[cycle] = torch.roll(cycle, -1)
    a, c = math.sqrt(h), margin / math.sqrt(h)

    target = LlamaForCausalLM(tcfg)
    _random_(target, seed + 7, std=noise / math.sqrt(h))
    with torch.no_grad():
        target.model.embed_tokens.weight.copy_(a * q)
        lm = torch.randn(v, h, generator=gen, dtype=torch.float64) * (0.15 * c)
        for x in cycle.tolist():                       # π is a bijection on the cycle
            lm[pi[x]] = c * q[x]
        target.lm_head.weight.copy_(lm)

    head = Eagle3Head(hcfg)
    _random_(head, seed + 11, std=head_noise / math.sqrt(h))
    with torch.no_grad():
        fc = torch.zeros(h, 3 * h, dtype=torch.float64)
        fc[:, 2 * h:] = torch.eye(h)
        head.fc.weight.copy_(fc)
        mlp = head.midlayer.mlp
        beta = 4.0
        gate = torch.zeros(hcfg.intermediate_size, h, dtype=torch.float64)
        up = torch.zeros_like(gate)
        down = torch.zeros(h, hcfg.intermediate_size, dtype=torch.float64)
        # post_attention_layernorm makes the state ≈ sqrt(H)·q_y; unit gate/up rows then read
        # ≈ sqrt(H) on row y and ≈ 0 elsewhere, so silu(β·g)·u ≈ β·H on row y only.
        gate[:v] = beta * q
        up[:v] = q
        for y in cycle.tolist():
            down[:, y] = a * (q[pi[y]] - q[y]) / (beta * h)
        mlp.gate_proj.weight.copy_(gate)
        mlp.up_proj.weight.copy_(up)
        mlp.down_proj.weight.copy_(down)
        # Draft id j is target id hot[j] = 2j: d2t[j] = j.
        head.d2t.copy_(hot - torch.arange(len(hot)))
        head.t2d.zero_()
        head.t2d[hot] = True
        inv = torch.empty(v, dtype=torch.long)
        inv[cycle] = torch.roll(cycle, 1)              # π⁻¹ on the cycle
        head.lm_head.weight.copy_(c * q[inv[hot]])
    target.cycle_map = pi                              # for tests: the rule the target follows
    return target, head


def load_models(model_path: str, draft_path: str | None, load_format: str, seed: int = 0,
                want_draft: bool = True, device: str | torch.device = "cpu") -> tuple[LlamaForCausalLM, Eagle3Head | None]:
    """The target and (optionally) its head in float32, from directories (on CPU) or preset
    names (random presets built on `device`)."""
    from refengine import loader

    if load_format == "dummy":
        if model_path not in TARGETS:
            raise loader.LoadError(f"--load-format dummy needs a preset name; presets: {', '.join(TARGETS)}")
        target = build_target(model_path, seed, device)
    elif model_path in TARGETS:
        raise loader.LoadError(f"{model_path!r} is a preset: add --load-format dummy")
    else:
        target = None
    head = None
    if want_draft:
        draft = draft_path or (matching_head(model_path) if model_path in TARGETS else None)
        if draft is None:
            raise loader.LoadError("speculation needs --speculative-draft-model-path (an EAGLE-3 head directory)")
        head = build_head(draft, seed, device) if draft in HEADS else loader.load_eagle3(draft)
    if target is None:
        aux = head.config.aux_layer_ids if head is not None else None
        target = loader.load_llama(model_path, aux)
    elif head is not None and head.config.aux_layer_ids:
        target.set_aux_layers(head.config.aux_layer_ids)
    if head is not None and head.config.vocab_size != target.config.vocab_size:
        raise loader.LoadError(f"draft vocab_size {head.config.vocab_size} != target vocab_size "
                               f"{target.config.vocab_size}")
    if head is not None:
        loader.attach_target_head(head, target)
    return target, head
