"""The draft vocabulary (d2t / t2d from frequencies) and the byte tokenizer description."""

from __future__ import annotations

import json

import torch

from refengine.data import TINY_TARGET_DIR
from refengine.train.byte_tokenizer import EOS_ID, VOCAB_SIZE, decode, encode, tokenizer_json
from refengine.train.draft_vocab import coverage, draft_vocab, token_counts, used_ids


def test_draft_vocab_is_the_most_frequent_ids_ascending():
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 3])
    d2t, t2d = draft_vocab(counts, 4)
    used = used_ids(d2t)
    assert used.tolist() == [0, 2, 3, 5]          # counts 5, 9, 9, 7: ascending by id
    assert (d2t >= 0).all() and (d2t[1:] >= d2t[:-1]).all()
    assert t2d.tolist() == [True, False, True, True, False, True, False, False]
    assert coverage(counts, t2d) == 30 / 34


def test_ties_break_by_id_and_zero_counts_pad_from_the_start():
    counts = torch.tensor([0, 2, 0, 2, 0, 2])
    d2t, _ = draft_vocab(counts, 2)
    assert used_ids(d2t).tolist() == [1, 3]
    d2t, _ = draft_vocab(counts, 5)                # only 3 seen: pad with unseen ids 0, 2
    assert used_ids(d2t).tolist() == [0, 1, 2, 3, 5]


def test_token_counts_and_bad_size():
    counts = token_counts(torch.tensor([1, 1, 3]), 5)
    assert counts.tolist() == [0, 2, 0, 1, 0]
    try:
        draft_vocab(counts, 6)
    except ValueError as e:
        assert "draft_vocab_size" in str(e)
    else:
        raise AssertionError("accepted a draft vocabulary larger than the vocabulary")


def test_byte_ids_round_trip():
    data = "déf f(x):\n\treturn x\x00".encode()
    ids = encode(data)
    assert ids.tolist() == list(data)
    assert decode(ids.tolist() + [EOS_ID, 260]) == data


def test_tokenizer_json_encodes_bytes_as_their_ids():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(tokenizer_json()))
    text = "class A:\n    x = 'é€'  # ünï\n"
    enc = tok.encode(text)
    assert enc.ids == list(text.encode())
    assert tok.decode(enc.ids) == text
    assert tok.get_vocab_size() == VOCAB_SIZE and tok.token_to_id("<|endoftext|>") == EOS_ID


def test_shipped_tokenizer_is_the_generated_one():
    shipped = json.loads((TINY_TARGET_DIR / "tokenizer.json").read_text())
    assert shipped == tokenizer_json()
