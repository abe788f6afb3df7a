"""The model layer on one process: our Llama ≡ transformers' LlamaForCausalLM on files we write,
checkpoint loading (sharded safetensors, EAGLE-3 heads from safetensors and pytorch_model.bin),
Llama-3 rope scaling, and the EAGLE-3 head's id mapping."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from refengine import loader, presets
from refengine.models.configs import Eagle3Config, LlamaConfig
from refengine.models.layers import causal_meta

torch.set_num_threads(1)

SCALED = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                     rope_theta=500000.0, max_position_embeddings=512,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32})


def _random_target(cfg: LlamaConfig, seed: int = 0):
    from refengine.models.llama import LlamaForCausalLM
    m = LlamaForCausalLM(cfg)
    presets._random_(m, seed, std=0.1)
    with torch.no_grad():   # non-trivial norm weights so a wrong norm shows
        for n, p in m.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    return m


def _forward(model, ids: torch.Tensor):
    b, t = ids.shape
    kv = model.make_kv(b, t + 4, torch.float32, "cpu")
    meta = causal_meta(torch.arange(b), torch.arange(t).expand(b, t), t)
    with torch.no_grad():
        h, aux = model(ids, meta, kv)
        return model.logits(h), aux


@pytest.mark.parametrize("shards", [1, 3])
def test_matches_transformers_on_written_checkpoint(tmp_path, shards):
    transformers = pytest.importorskip("transformers")
    ours = _random_target(SCALED)
    loader.save_llama(ours, tmp_path, shards=shards)
    if shards > 1:
        assert (tmp_path / "model.safetensors.index.json").exists()
    ref = transformers.LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    loaded = loader.load_llama(tmp_path)
    ids = torch.randint(0, SCALED.vocab_size, (2, 40), generator=torch.Generator().manual_seed(3))
    logits, aux = _forward(loaded, ids)
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    # Tolerance: fp32, same math in a different order.
    torch.testing.assert_close(logits, out.logits, rtol=1e-4, atol=1e-4)
    # aux = outputs of layers [1, L//2-1, L-4] = HF hidden_states[2], [L//2], [L-3].
    hs = out.hidden_states
    torch.testing.assert_close(aux, torch.cat([hs[2], hs[4], hs[5]], -1), rtol=1e-4, atol=1e-4)


def test_incremental_decode_matches_full_forward():
    model = _random_target(SCALED)
    ids = torch.randint(0, SCALED.vocab_size, (1, 24), generator=torch.Generator().manual_seed(5))
    full, _ = _forward(model, ids)
    kv = model.make_kv(1, 32, torch.float32, "cpu")
    outs = []
    with torch.no_grad():
        for p in range(24):
            meta = causal_meta(torch.tensor([0]), torch.tensor([[p]]), 32)
            h, _ = model(ids[:, p:p + 1], meta, kv)
            outs.append(model.logits(h))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_eagle3_head_loads_both_file_kinds(tmp_path, fmt):
    head = presets.build_head("tiny-eagle3", seed=4)
    loader.save_eagle3(head, tmp_path, fmt=fmt)
    names = set(head.state_dict())
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight",
            "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    loaded = loader.load_eagle3(tmp_path)
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # draft id -> target id is id + d2t[id]
    ids = torch.tensor([0, 5, 127])
    assert torch.equal(loaded.to_target_ids(ids), ids + head.d2t[ids])


def test_loader_errors_name_the_problem(tmp_path):
    head = presets.build_head("tiny-eagle3")
    loader.save_eagle3(head, tmp_path)
    # Both widths: a head whose widths differ is refused before its tensors are read.
    cfg = (tmp_path / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": 32') \
        .replace('"target_hidden_size": 64', '"target_hidden_size": 32')
    (tmp_path / "config.json").write_text(cfg)
    with pytest.raises(loader.LoadError, match="shape"):
        loader.load_eagle3(tmp_path)
    with pytest.raises(loader.LoadError, match="missing"):
        loader.load_llama(tmp_path / "nowhere")


def test_llama3_rope_scaling_changes_only_low_frequencies():
    from refengine.models.layers import rope_inv_freq
    plain = rope_inv_freq(16, 500000.0, None)
    scaled = rope_inv_freq(16, 500000.0, SCALED.rope_scaling)
    assert torch.allclose(scaled[0], plain[0])            # high frequency kept
    assert torch.allclose(scaled[-1], plain[-1] / 8.0)    # low frequency slowed by factor


def test_eagle_config_fields():
    d = presets.HEADS["llama-3.1-8b-eagle3"].to_dict()
    d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 15, 28]
    cfg = Eagle3Config.from_dict(d)
    assert cfg.aux_layer_ids == (1, 15, 28) and cfg.draft_vocab_size == 32000
    assert presets.TARGETS["llama-3.1-8b"].default_aux_layers() == (1, 15, 28)


def test_every_random_preset_loads_with_its_head():
    # Each random target preset has a matching head that load_models attaches (same vocabulary,
    # hot ids inside it); the 8B is shape-checked above, not built on a CPU.
    for name in [n for n in presets.TARGETS if n != "llama-3.1-8b"]:
        target, head = presets.load_models(name, None, "dummy")
        assert head is not None and head.config.vocab_size == target.config.vocab_size, name
        hot = torch.arange(head.config.draft_vocab_size) + head.d2t
        assert int(hot.max()) < target.config.vocab_size and bool(head.t2d[hot].all()), name
    assert presets.TARGETS["llama-small"].num_hidden_layers == 8


def test_agreeing_pair_agrees():
    t = presets.build_target("tiny-agreeing")
    h = presets.build_head("tiny-agreeing-eagle3")
    assert torch.equal(h.d2t, torch.arange(64))          # draft id j -> target id 2j
    assert dataclasses.asdict(t.config)["vocab_size"] == 128
