"""The corpus file list, its checks, the portable corpus file, and the held-out prompts."""

from __future__ import annotations

import json

import pytest
import torch

from refengine.data import TINY_CORPUS_LIST, TINY_PROMPTS
from refengine.train import corpus as C
from refengine.train.byte_tokenizer import EOS_ID


@pytest.fixture
def libdir(tmp_path):
    d = tmp_path / "lib"
    d.mkdir()
    for i in range(14):
        (d / f"mod{i:02d}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * (i + 1))
    return d


def test_list_round_trip_and_build(libdir, tmp_path):
    fl = C.make_file_list(libdir, "test lib")
    # The name-hash rule may put every file of a small set on one side; the list is explicit.
    entries = tuple(C.FileEntry("val" if i < 2 else "train", e.sha256, e.path)
                    for i, e in enumerate(fl.entries))
    fl = C.FileList(entries, fl.source)
    path = tmp_path / "list.txt"
    C.write_file_list(fl, path)
    back = C.read_file_list(path)
    assert back == fl and back.digest == fl.digest
    corpus = C.build_corpus(back, libdir)
    # Files joined with EOS after each, bytes as ids.
    assert (corpus.val == EOS_ID).sum() == 2 and (corpus.train == EOS_ID).sum() == 12
    first = (libdir / entries[0].path).read_bytes()
    assert corpus.val[: len(first)].tolist() == list(first)


def _write(libdir, tmp_path):
    fl = C.make_file_list(libdir, "test lib")
    fl = C.FileList(tuple(C.FileEntry("val" if i == 0 else "train", e.sha256, e.path)
                          for i, e in enumerate(fl.entries)), fl.source)
    path = tmp_path / "list.txt"
    C.write_file_list(fl, path)
    return fl, path


def test_missing_and_changed_files_fail_with_one_clear_line(libdir, tmp_path):
    fl, _ = _write(libdir, tmp_path)
    (libdir / "mod03.py").unlink()
    (libdir / "mod05.py").write_text("changed\n")
    with pytest.raises(C.CorpusError) as e:
        C.build_corpus(fl, libdir)
    msg = str(e.value)
    assert "1 missing, 1 different" in msg and "mod03.py" in msg and "--stdlib-dir" in msg
    assert "\n" not in msg


def test_hand_edited_list_is_refused(libdir, tmp_path):
    _, path = _write(libdir, tmp_path)
    text = path.read_text().replace("train ", "val ", 1)
    path.write_text(text)
    with pytest.raises(C.CorpusError, match="digest"):
        C.read_file_list(path)


@pytest.mark.parametrize("line", ["train abc mod.py", "test " + "0" * 64 + " mod.py",
                                  "train " + "0" * 64 + " ../etc/passwd"])
def test_malformed_list_lines(tmp_path, line):
    path = tmp_path / "list.txt"
    path.write_text(C.LIST_HEADER + "\n" + line + "\n")
    with pytest.raises(C.CorpusError, match="malformed"):
        C.read_file_list(path)


def test_not_a_list(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    with pytest.raises(C.CorpusError, match="not a corpus file list"):
        C.read_file_list(path)


def test_saved_corpus_round_trip_and_digest_check(libdir, tmp_path):
    fl, _ = _write(libdir, tmp_path)
    corpus = C.build_corpus(fl, libdir)
    out = tmp_path / "corpus.safetensors"
    C.save_corpus(corpus, out)
    back = C.load_corpus(out, fl.digest)
    assert torch.equal(back.train, corpus.train) and torch.equal(back.val, corpus.val)
    with pytest.raises(C.CorpusError, match="expected"):
        C.load_corpus(out, "0" * 64)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(C.CorpusError, match="not a readable corpus file"):
        C.load_corpus(bad, fl.digest)


def test_shipped_list_is_consistent_and_builds_or_says_why():
    fl = C.read_file_list(TINY_CORPUS_LIST)
    assert len(fl.entries) > 100 and {e.split for e in fl.entries} == {"train", "val"}
    try:
        corpus = C.build_corpus(fl, C.default_stdlib_dir())
    except C.CorpusError as e:  # another Python: the message must say what to do
        assert "--corpus" in str(e) and "does not match the corpus list" in str(e)
    else:
        assert corpus.train.numel() > 4_000_000 and corpus.val.numel() > 300_000


def test_shipped_prompts_come_from_val_files():
    fl = C.read_file_list(TINY_CORPUS_LIST)
    val = {e.path for e in fl.entries if e.split == "val"}
    prompts = C.read_prompts(TINY_PROMPTS)
    assert len(prompts) == 64 and len({p["id"] for p in prompts}) == 64
    for p in prompts:
        assert p["source"].split(":")[0] in val and len(p["prompt"]) == 96 and p["prompt"].isascii()


def test_bad_prompt_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n{broken\n")
    with pytest.raises(C.CorpusError, match=":2: not JSON"):
        C.read_prompts(path)
    path.write_text(json.dumps({"text": "no prompt key"}) + "\n")
    with pytest.raises(C.CorpusError, match="string 'prompt'"):
        C.read_prompts(path)
