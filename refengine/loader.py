"""Loading checkpoints with their own names: HF Llama directories and EAGLE-3 head directories,
plus the random-weight presets (`--model-path <preset> --load-format dummy`, SGLang's way).

Must not rename tensors beyond the EAGLE-3 spellings SGLang accepts (`eagle3_name`): a name the
model does not have is an error that says which file and name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from refengine.models.configs import Eagle3Config, LlamaConfig
from refengine.models.eagle3 import Eagle3Head
from refengine.models.llama import LlamaForCausalLM

DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
          "half": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class LoadError(RuntimeError):
    """A checkpoint that cannot be loaded; the message names the file and the reason."""


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name not in DTYPES:
        raise LoadError(f"unknown dtype {name!r}; choose auto or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LoadError(f"{path}: missing") from None
    except json.JSONDecodeError as e:
        raise LoadError(f"{path}: not valid JSON ({e})") from None


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: sharded safetensors (with index), single
    safetensors files, or pytorch_model.bin."""
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(read_json(index)["weight_map"].values()))
        paths = [directory / f for f in files]
    else:
        paths = sorted(directory.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if paths:
        for p in paths:
            if not p.exists():
                raise LoadError(f"{p}: listed in the index but missing")
            state.update(load_file(str(p)))
        return state
    bins = sorted(directory.glob("pytorch_model*.bin"))
    if not bins:
        raise LoadError(f"{directory}: no *.safetensors or pytorch_model.bin found")
    for p in bins:
        state.update(torch.load(p, map_location="cpu", weights_only=True))
    return state


def _assign(module: torch.nn.Module, state: dict[str, torch.Tensor], where: Path,
            optional: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> None:
    own = dict(module.named_parameters())
    own.update(dict(module.named_buffers()))
    unexpected = [k for k in state if k not in own and not k.startswith(ignore)]
    if unexpected:
        raise LoadError(f"{where}: tensors the model does not have: {', '.join(unexpected[:5])}")
    missing = [k for k in own if k not in state and k not in optional and not k.endswith("inv_freq")]
    if missing:
        raise LoadError(f"{where}: missing tensors: {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, tensor in state.items():
            if name not in own:
                continue
            dst = own[name]
            if tuple(dst.shape) != tuple(tensor.shape):
                raise LoadError(f"{where}: {name} has shape {list(tensor.shape)}, the config implies {list(dst.shape)}")
            dst.copy_(tensor.to(dst.dtype))


def load_llama(path: str | Path, aux_layer_ids: tuple[int, ...] | None = None) -> LlamaForCausalLM:
    """An HF Llama directory (config.json + safetensors) as a float32 CPU model."""
    directory = Path(path)
    cfg = LlamaConfig.from_dict(read_json(directory / "config.json"))
    model = LlamaForCausalLM(cfg, aux_layer_ids)
    optional = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    _assign(model, read_state_dict(directory), directory, optional=optional)
    return model


def eagle3_name(name: str) -> str:
    """A head tensor's name in this engine's spelling. SGLang 0.5.23 loads `midlayer.*` as
    `layers.0.*` and tries every name with a `model.` prefix (llama_eagle3.py:325-378), so heads
    are published as `midlayer.*`, `layers.0.*`, `model.layers.0.*` or `model.fc.weight` alike."""
    if name.startswith("model.") and not name.startswith("model.embed_tokens."):
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def load_eagle3(path: str | Path) -> Eagle3Head:
    """An EAGLE-3 head directory (config.json + safetensors or pytorch_model.bin) as float32 CPU.

    d2t / t2d may be absent when draft_vocab_size == vocab_size (identity mapping). A checkpoint
    that also stores an embedding has it ignored: the head always shares the target's. A head
    whose lm_head is the target's (`lm_head_source`) ignores a stored lm_head, as SGLang
    overwrites it; `attach_target_head` fills it in once the target is loaded.
    """
    directory = Path(path)
    cfg = Eagle3Config.from_dict(read_json(directory / "config.json"))
    head = Eagle3Head(cfg)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in read_state_dict(directory).items():
        own = eagle3_name(name)
        if own in state:
            raise LoadError(f"{directory}: {name} and another tensor both load as {own}")
        state[own] = tensor
    optional: tuple[str, ...] = ("t2d",)
    if cfg.draft_vocab_size == cfg.vocab_size:
        optional += ("d2t",)
    if cfg.lm_head_source != "own":
        optional += ("lm_head.weight",)
        state.pop("lm_head.weight", None)
    _assign(head, state, directory, optional=optional, ignore=("embed_tokens.", "model.embed_tokens."))
    return head


def attach_target_head(head: Eagle3Head, target: LlamaForCausalLM) -> None:
    """Give a head that uses the target's lm_head (or, tied, the target's embedding) those weights
    (SGLang: `set_embed_and_head` / `set_embed`, eagle_worker_v2.py:352-363). A copy, so tensor
    parallelism and draft placements shard it like any head's own lm_head."""
    source = head.config.lm_head_source
    if source == "own":
        return
    weight = target.model.embed_tokens.weight if source == "target_embedding" else target.lm_head.weight
    dst = head.lm_head.weight
    if tuple(dst.shape) != tuple(weight.shape):
        raise LoadError(f"the draft head uses the target's {source.split('_', 1)[1].replace('_', ' ')} "
                        f"{list(weight.shape)}, but its own hidden size and vocabulary imply {list(dst.shape)}")
    with torch.no_grad():
        dst.copy_(weight.to(dst.dtype))


def save_llama(model: LlamaForCausalLM, directory: str | Path, shards: int = 1) -> None:
    """Write an HF-layout directory (config.json + safetensors, sharded with an index if shards > 1)."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2))
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    _save_sharded(state, d, shards, save_file)


def save_eagle3(head: Eagle3Head, directory: str | Path, fmt: str = "safetensors") -> None:
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2))
    state = {k: v.detach().contiguous().clone() for k, v in head.state_dict().items()}
    if fmt == "bin":
        torch.save(state, d / "pytorch_model.bin")
    else:
        save_file(state, str(d / "model.safetensors"))


def _save_sharded(state: dict[str, torch.Tensor], d: Path, shards: int, save_file) -> None:
    if shards <= 1:
        save_file(state, str(d / "model.safetensors"))
        return
    names = list(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in part}, str(d / fname))
        weight_map.update({k: fname for k in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
