"""Writing the trained models as checkpoint directories the engine loads like real models.

Target: `config.json` + `model.safetensors` (HF Llama names) + `tokenizer.json` and
`tokenizer_config.json`. Head: `config.json` + `model.safetensors` with `fc`, `midlayer.*`, `norm`,
`lm_head`, `d2t` (int64), `t2d` (bool), and no embedding (it is the target's, as in official heads).

Must not: rename tensors, or write anything outside the given directories.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from refengine.train.byte_tokenizer import write_tokenizer_files

EXCLUDED_HEAD_KEYS = ("embed_tokens.weight",)


def _tensors(module: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in module.state_dict().items():
        if name in skip:
            continue
        t = t.detach().to("cpu")
        out[name] = t.float().contiguous() if t.is_floating_point() else t.contiguous()
    return out


def save_target(target: nn.Module, config: dict, out_dir: Path) -> Path:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(_tensors(target), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(out_dir)
    return out_dir


def save_head(head: nn.Module, config: dict, out_dir: Path) -> Path:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(_tensors(head, EXCLUDED_HEAD_KEYS), str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    return out_dir


def load_state(module: nn.Module, path: Path, strict: bool = True) -> None:
    """Load a model.safetensors written above back into a freshly built module."""
    from safetensors.torch import load_file

    missing, unexpected = module.load_state_dict(load_file(str(path)), strict=False)
    missing = [m for m in missing if m not in EXCLUDED_HEAD_KEYS]
    if strict and (missing or unexpected):
        raise ValueError(f"{path}: missing {missing[:3]}, unexpected {unexpected[:3]}")
