"""Text <-> token ids for the HTTP process: the model directory's `tokenizer.json`, else bytes.

Random-weight presets ship no tokenizer, so they get a byte-level one (id = UTF-8 byte) limited to
the model's vocabulary; text that does not fit is refused rather than silently mangled.
Must not import torch (the HTTP process needs only `tokenizers` for real checkpoints).
"""

from __future__ import annotations

from pathlib import Path

from refengine.server.inputs import BadRequest


class ByteTokenizer:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.limit = min(vocab_size, 256)

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

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(model_path: str | None, vocab_size: int) -> ByteTokenizer | HFTokenizer:
    if model_path:
        f = Path(model_path) / "tokenizer.json"
        if f.is_file():
            return HFTokenizer(f)
    return ByteTokenizer(vocab_size)
