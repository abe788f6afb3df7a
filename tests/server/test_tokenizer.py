"""Text <-> ids in the HTTP process: the checkpoint's tokenizer.json, else bytes within the vocabulary."""

import sys

import pytest

from refengine.data import TINY_TARGET_DIR
from refengine.server.inputs import BadRequest
from refengine.server.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

needs_shipped = pytest.mark.skipif(not (TINY_TARGET_DIR / "tokenizer.json").is_file(),
                                   reason="the shipped tiny model is not installed")


def test_byte_tokenizer_refuses_what_the_vocabulary_lacks():
    t = ByteTokenizer(128)
    assert t.encode("hi") == [104, 105] and t.decode([104, 105, 200]) == "hi"
    with pytest.raises(BadRequest, match="byte vocabulary"):
        t.encode("é")


@needs_shipped
def test_shipped_model_tokenizer_round_trip():
    t = load_tokenizer(str(TINY_TARGET_DIR), 264)
    assert isinstance(t, HFTokenizer)
    text = "def f(x):\n    return 'é'\n"
    assert t.encode(text) == list(text.encode()) and t.decode(t.encode(text) + [256]) == text


@needs_shipped
def test_without_tokenizers_package_the_byte_model_still_works(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as where `tokenizers` is not installed
    t = load_tokenizer(str(TINY_TARGET_DIR), 264)
    assert isinstance(t, ByteTokenizer) and t.encode("ab") == [97, 98]
