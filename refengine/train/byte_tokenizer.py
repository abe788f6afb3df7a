"""The tiny model's byte-level vocabulary and its Hugging Face `tokenizer.json` description.

Ids 0..255 are the raw bytes, 256 is EOS, 257..263 are reserved (never produced) so the vocabulary is
264 = a multiple of 8 and splits evenly over 1, 2, 4 or 8 tensor-parallel ranks. The description is a
standard `tokenizers` file (byte-level BPE with no merges, vocab ordered so the id of byte b is b),
so the engine loads it like any other model's `tokenizer.json`.

Must not: depend on torch beyond the tensor helpers, or change ids (the shipped weights use them).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

NUM_BYTES = 256
EOS_ID = 256
VOCAB_SIZE = 264
EOS_TOKEN = "<|endoftext|>"
RESERVED = [f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - NUM_BYTES - 1)]


def encode(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


def decode(ids: list[int] | torch.Tensor) -> bytes:
    """Bytes of the byte ids; EOS and reserved ids are dropped."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return bytes(i for i in ids if 0 <= i < NUM_BYTES)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's printable stand-in for every byte, which the ByteLevel pre-tokenizer and decoder use.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json() -> dict:
    """A `tokenizers` description whose encode(text) = list(text.encode('utf-8'))."""
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(NUM_BYTES)}
    specials = [EOS_TOKEN, *RESERVED]
    added = [{"id": NUM_BYTES + i, "content": tok, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, tok in enumerate(specials)]
    for a in added:
        vocab[a["content"]] = a["id"]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                          "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def write_tokenizer_files(out_dir: Path) -> None:
    """tokenizer.json plus the small tokenizer_config.json that names EOS."""
    out_dir = Path(out_dir)
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False,
                                                       indent=1) + "\n")
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "bos_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }, indent=1) + "\n")
