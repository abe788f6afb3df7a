"""EAGLE-3 draft-head checkpoints loaded as SGLang 0.5.23 loads them, on head directories built here.

SGLang's rules (`sglang/srt/models/llama_eagle3.py`, `sglang/srt/speculative/eagle_worker_v2.py`):
- names: `midlayer` is renamed `layers.0`, and every name is tried as given and with a `model.`
  prefix (llama_eagle3.py:325-378), so `midlayer.*`, `layers.0.*`, `model.layers.0.*`,
  `model.midlayer.*` and `model.fc.weight` all load;
- lm_head: with `tie_word_embeddings` the head's lm_head is its embedding, which is the target's
  (llama_eagle3.py:300-303 and `set_embed`); without `draft_vocab_size` it is the target's lm_head
  (llama_eagle3.py:304-308, eagle_worker_v2.py:352-363: `set_embed_and_head`), whatever the file holds;
- `norm_output`: the draft feeds its normed hidden state back instead of the pre-norm one
  (llama_eagle3.py:207, 264-269).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from refengine import loader
from refengine.models.configs import Eagle3Config, LlamaConfig
from refengine.models.eagle3 import Eagle3Head
from refengine.models.layers import causal_meta
from refengine.models.llama import LlamaForCausalLM
from refengine.presets import load_models

H, V = 32, 96


def target_dir(tmp: Path) -> Path:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    d = tmp / "target"
    loader.save_llama(LlamaForCausalLM(cfg), d)
    return d


def head_state(draft_vocab: int = 48) -> tuple[dict, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    cfg = Eagle3Config(hidden_size=H, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=V, draft_vocab_size=draft_vocab, target_hidden_size=H)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
        head.d2t.copy_(torch.arange(draft_vocab) * (V // draft_vocab - 1))
    state = {k: v.detach().clone().contiguous() for k, v in head.state_dict().items()}
    return cfg.to_dict(), state


def write_head(d: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    save_file(state, str(d / "model.safetensors"))
    return d


RENAMES = [
    ("midlayer.* (as published by EAGLE-3)", lambda k: k),
    ("layers.0.*", lambda k: k.replace("midlayer.", "layers.0.")),
    ("model.layers.0.* and model.fc / model.norm", lambda k: "model." + k.replace("midlayer.", "layers.0.")
     if k not in ("lm_head.weight", "d2t", "t2d") else k),
    ("model.midlayer.*", lambda k: "model." + k if k.startswith("midlayer.") else k),
]


@pytest.mark.parametrize("why, rename", RENAMES, ids=[r[0] for r in RENAMES])
def test_weight_name_variants_load_the_same_head(tmp_path, why, rename):
    config, state = head_state()
    d = write_head(tmp_path / "head", config, {rename(k): v for k, v in state.items()})
    head = loader.load_eagle3(d)
    got = head.state_dict()
    assert set(got) == set(state)
    for k, v in state.items():
        assert torch.equal(got[k], v), k


def test_two_spellings_of_one_tensor_are_refused(tmp_path):
    config, state = head_state()
    state["layers.0.mlp.up_proj.weight"] = state["midlayer.mlp.up_proj.weight"].clone()
    with pytest.raises(loader.LoadError, match="both load as midlayer.mlp.up_proj.weight"):
        loader.load_eagle3(write_head(tmp_path / "head", config, state))


@pytest.mark.parametrize("ships_lm_head", [False, True])
def test_no_draft_vocab_size_uses_the_targets_lm_head(tmp_path, ships_lm_head):
    config, state = head_state(draft_vocab=V)
    del config["draft_vocab_size"]
    state.pop("d2t"), state.pop("t2d")
    if not ships_lm_head:
        state.pop("lm_head.weight")  # as such heads are published
    d = write_head(tmp_path / "head", config, state)
    target, head = load_models(str(target_dir(tmp_path)), str(d), "auto")
    assert head.config.lm_head_source == "target_lm_head" and head.config.draft_vocab_size == V
    assert torch.equal(head.lm_head.weight, target.lm_head.weight)
    assert torch.equal(head.d2t, torch.zeros(V, dtype=torch.long))  # identity: draft id = target id


def test_tied_head_uses_the_targets_embedding(tmp_path):
    config, state = head_state(draft_vocab=V)
    config["tie_word_embeddings"] = True
    state.pop("lm_head.weight"), state.pop("d2t"), state.pop("t2d")
    d = write_head(tmp_path / "head", config, state)
    target, head = load_models(str(target_dir(tmp_path)), str(d), "auto")
    assert head.config.lm_head_source == "target_embedding"
    assert torch.equal(head.lm_head.weight, target.model.embed_tokens.weight)


def test_own_lm_head_is_still_required_when_the_head_has_its_own_vocabulary(tmp_path):
    config, state = head_state()
    state.pop("lm_head.weight")
    with pytest.raises(loader.LoadError, match="missing tensors: lm_head.weight"):
        loader.load_eagle3(write_head(tmp_path / "head", config, state))


def test_target_head_of_another_width_is_a_load_error(tmp_path):
    config, state = head_state(draft_vocab=V)
    del config["draft_vocab_size"]
    # A head that says it drafts for a 16-wide target, given a 32-wide one.
    config["hidden_size"] = config["target_hidden_size"] = 16
    config["head_dim"] = 4
    torch.manual_seed(2)
    head = Eagle3Head(Eagle3Config.from_dict(config))
    state = {k: v.detach().clone().contiguous() for k, v in head.state_dict().items()}
    d = write_head(tmp_path / "head", config, state)
    with pytest.raises(loader.LoadError, match="uses the target's lm head"):
        load_models(str(target_dir(tmp_path)), str(d), "auto")


def _forward(head: Eagle3Head, embed: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    head.set_embed(embed)
    torch.manual_seed(3)
    ids = torch.randint(0, V, (1, 5))
    aux = torch.randn(1, 5, 3 * H)
    kv = head.make_kv(1, 8, torch.float32, "cpu")
    meta = causal_meta(torch.tensor([0]), torch.arange(5)[None], 8)
    logits, fed_back = head(ids, aux, meta, kv)
    # The pre-norm output, recomputed: the midlayer over the same inputs.
    kv2 = head.make_kv(1, 8, torch.float32, "cpu")
    pre = head.midlayer(embed(ids), head.fc(aux), causal_meta(torch.tensor([0]), torch.arange(5)[None], 8), kv2)
    return logits, fed_back, pre


@pytest.mark.parametrize("norm_output", [False, True])
def test_norm_output_feeds_back_the_normed_hidden(tmp_path, norm_output):
    config, state = head_state()
    if norm_output:
        config["norm_output"] = True
    head = loader.load_eagle3(write_head(tmp_path / "head", config, state))
    assert head.config.norm_output is norm_output
    embed = torch.nn.Embedding(V, H)
    with torch.no_grad():
        logits, fed_back, pre = _forward(head, embed)
        want = head.norm(pre) if norm_output else pre
        assert torch.allclose(fed_back, want, atol=1e-5)
        assert torch.allclose(logits, head.lm_head(head.norm(pre)), atol=1e-5)  # logits never change


def test_config_round_trip_keeps_the_rules():
    d = {"hidden_size": H, "intermediate_size": 64, "num_attention_heads": 4, "vocab_size": V,
         "norm_output": True}
    cfg = Eagle3Config.from_dict(d)
    again = Eagle3Config.from_dict(cfg.to_dict())
    assert (again.lm_head_source, again.norm_output, again.draft_vocab_size) == ("target_lm_head", True, V)


@pytest.mark.parametrize("change, match", [
    # llama_eagle3.py:160-166: fc's width is the aux count (num_aux_hidden_states, else the ids').
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}, "over 4 target layers"),
    ({"num_aux_hidden_states": 2}, "over 2 target layers"),
    # models/llama.py:910-916: SGLang keeps the head's own embedding when the widths differ.
    ({"target_hidden_size": 2 * H}, "target_hidden_size"),
])
def test_heads_sglang_loads_but_the_engine_cannot_are_refused_at_load(tmp_path, change, match):
    config, state = head_state()
    with pytest.raises(ValueError, match=match):
        loader.load_eagle3(write_head(tmp_path / "head", {**config, **change}, state))
    Eagle3Config.from_dict({**config, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}})
