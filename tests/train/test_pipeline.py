"""`train-tiny` end to end on a seconds budget: corpus → target → draft vocab → TTT head → files
the engine's loader reads → speculative generation that equals plain greedy decoding."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open

from refengine.loader import load_eagle3, load_llama
from refengine.train import corpus as C
from refengine.train import main
from refengine.train.evaluate import generate_chain

MODULES = ["abc.py", "bisect.py", "heapq.py", "keyword.py", "colorsys.py", "fnmatch.py",
           "genericpath.py", "stat.py", "textwrap.py", "shlex.py"]
SMALL = ["--hidden", "32", "--heads", "4", "--kv-heads", "2", "--intermediate", "64",
         "--draft-vocab", "96", "--seq-len", "64", "--target-batch", "4", "--head-batch", "4",
         "--threads", "1", "--seed", "0"]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """A small stdlib-like directory (real modules of this Python) and its committed-style list."""
    d = tmp_path_factory.mktemp("lib")
    src = C.default_stdlib_dir()
    for m in MODULES:
        shutil.copy(src / m, d / m)
    fl = C.make_file_list(d, "test subset")
    fl = C.FileList(tuple(C.FileEntry("val" if e.path in ("shlex.py", "stat.py") else "train",
                                      e.sha256, e.path) for e in fl.entries), fl.source)
    path = d.parent / "list.txt"
    C.write_file_list(fl, path)
    return d, path


@pytest.fixture(scope="module")
def trained(lib, tmp_path_factory):
    d, path = lib
    out = tmp_path_factory.mktemp("tiny")
    rc = main(["--file-list", str(path), "--stdlib-dir", str(d), "--out", str(out),
               "--target-steps", "40", "--head-steps", "20", "--ttt-k", "3",
               "--eval-every", "20", "--eval-prompts", "2", "--eval-new-tokens", "8", *SMALL])
    assert rc == 0
    return out


def test_outputs_have_the_checkpoint_layout(trained):
    assert {p.name for p in (trained / "target").iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    with safe_open(str(trained / "eagle3" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
            "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight",
            "midlayer.mlp.down_proj.weight"} <= names
    assert not any("embed" in n for n in names)          # the embedding is the target's
    cfg = json.loads((trained / "eagle3" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg["draft_vocab_size"] == 96
    report = json.loads((trained / "train_report.json").read_text())
    assert report["target"]["steps"] == 40 and report["head"]["ttt_k"] == 3
    assert report["target"]["val_loss"] < 5.0            # learnt something from 5.58 = ln 264
    assert set(report["quick_tau_greedy"]) == {"1", "3"}


def test_outputs_load_in_the_engine_and_speculation_is_lossless(trained):
    target = load_llama(trained / "target").eval()
    head = load_eagle3(trained / "eagle3").eval()
    used = torch.arange(96) + head.d2t
    assert head.t2d.sum() == 96 and head.t2d[used].all()
    hcfg = json.loads((trained / "eagle3" / "config.json").read_text())
    prompt = torch.tensor(list(b"def main(argv):\n    "))
    plain = prompt.tolist()
    with torch.no_grad():
        from refengine.train.models import target_forward
        for _ in range(12):
            logits, _ = target_forward(target, torch.tensor([plain]), [1, 3, 4])
            plain.append(int(logits[0, -1].argmax()))
    for steps in (1, 3):
        out, stats = generate_chain(target, head, hcfg, [1, 3, 4], prompt, 12, steps)
        assert out[:12] == plain[len(prompt):]
        assert 1.0 <= stats.tau <= steps + 1


def test_head_only_retraining_reuses_the_target(lib, trained, tmp_path):
    d, path = lib
    rc = main(["--file-list", str(path), "--stdlib-dir", str(d), "--out", str(tmp_path),
               "--target-from", str(trained / "target"), "--head-steps", "3", "--ttt-k", "1",
               "--eval-prompts", "0", *SMALL])
    assert rc == 0
    a = load_llama(trained / "target").state_dict()
    b = load_llama(tmp_path / "target").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_wrong_corpus_file_and_missing_files_exit_2(lib, tmp_path, capsys):
    d, path = lib
    other = tmp_path / "other.safetensors"
    C.save_corpus(C.Corpus(torch.arange(100), torch.arange(100), "f" * 64), other)
    assert main(["--file-list", str(path), "--corpus", str(other), "--out", str(tmp_path)]) == 2
    assert "rebuild it from the committed list" in capsys.readouterr().err
    assert main(["--file-list", str(path), "--stdlib-dir", str(tmp_path), "--out",
                 str(tmp_path)]) == 2
    assert "10 missing" in capsys.readouterr().err
