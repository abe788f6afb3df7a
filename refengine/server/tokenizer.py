"""Text <-> token ids for the HTTP process: the model directory's `tokenizer.json`, else bytes.

Random-weight presets ship no tokenizer, so they get a byte-level one (id = UTF-8 byte) limited to
the model's vocabulary; text that does not fit is refused rather than silently mangled.
Must not import torch (the HTTP process needs only `tokenizers` for real checkpoints).
"""

from __future__ import annotations

import json
from pathlib import Path

from refengine.server.inputs import BadRequest


def fewest_tokens(text: str, longest: int) -> int:
    """A lower bound on how many tokens `text` encodes to, when no token covers more than
    `longest` characters: counted without tokenizing, so a prompt far past the context is refused
    before the tokenizer spends seconds of the HTTP process's GIL on it."""
    return -(-len(text) // max(1, longest))


class ByteTokenizer:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.limit = min(vocab_size, 256)

    def fewest_tokens(self, text: str) -> int:
        return len(text)      # one id per UTF-8 byte, and a character is at least one byte

    def encode(self, text: str) -> list[int]:
        ids = list(text.encode("utf-8"))
        bad = [i for i in ids if i >= self.limit]
        if bad:
            raise BadRequest(f"text holds byte {bad[0]} but this model's byte vocabulary ends at "
                             f"{self.limit - 1}; send input_ids instead")
        return ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < self.limit).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        # The longest token in characters, doubled: a normalizer may fold two characters into one
        # (NFC composes "e" + U+0301) before the model's tokens are matched.
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self._longest = 2 * max((len(t) for t in vocab), default=1)

    def fewest_tokens(self, text: str) -> int:
        return fewest_tokens(text, self._longest)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


class IdsOnlyTokenizer:
    """A real checkpoint's tokenizer without the `tokenizers` package: input_ids in, ids out."""

    def fewest_tokens(self, text: str) -> int:
        return 0

    def encode(self, text: str) -> list[int]:
        raise BadRequest("this server cannot tokenize text (the `tokenizers` package is missing); "
                         "send input_ids")

    def decode(self, ids: list[int]) -> str:
        return ""


def _is_byte_level(path: Path) -> bool:
    """The shipped tiny model's description: byte-level BPE, no merges, byte b has id b."""
    try:
        d = json.loads(path.read_text())
        model = d["model"]
        return model.get("type") == "BPE" and not model.get("merges") and len(model["vocab"]) <= 264
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def load_tokenizer(model_path: str | None, vocab_size: int) -> ByteTokenizer | HFTokenizer | IdsOnlyTokenizer:
    if model_path:
        f = Path(model_path) / "tokenizer.json"
        if f.is_file():
            try:
                return HFTokenizer(f)
            except ImportError:
                return ByteTokenizer(vocab_size) if _is_byte_level(f) else IdsOnlyTokenizer()
    return ByteTokenizer(vocab_size)
