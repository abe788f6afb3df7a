"""The training corpus: Python standard-library sources named by a committed file list.

Distributions ship different stdlib files (and patch releases change them), so the corpus is an
explicit list of (split, sha256, path) lines with an aggregate hash. Building it checks every file
and fails with one clear message when a file is missing or different; a corpus built once can be
saved to a single file and carried to another machine (e.g. a GPU host with another Python).

Must not: train anything, or silently substitute files that are not in the list.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from refengine.train.byte_tokenizer import EOS_ID, encode

LIST_HEADER = "# refengine tiny-model corpus file list v1"
SPLITS = ("train", "val")


class CorpusError(Exception):
    """The corpus cannot be built or loaded as the file list demands (message is one line)."""


@dataclass(frozen=True)
class FileEntry:
    split: str
    sha256: str
    path: str  # relative to the stdlib directory, '/' separated


@dataclass(frozen=True)
class FileList:
    entries: tuple[FileEntry, ...]
    source: str  # free text: which interpreter the list was made from

    @property
    def digest(self) -> str:
        """Aggregate hash over every (split, sha256, path) line, order included."""
        h = hashlib.sha256()
        for e in self.entries:
            h.update(f"{e.split} {e.sha256} {e.path}\n".encode())
        return h.hexdigest()


@dataclass
class Corpus:
    """Token ids (int64, bytes + EOS between files) per split, and the list digest they came from."""

    train: torch.Tensor
    val: torch.Tensor
    digest: str


def default_stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _split_for(path: str) -> str:
    # Deterministic by name, about 1 file in 12 held out; the split is written into the list, so
    # this rule only matters when a new list is made.
    return "val" if hashlib.sha256(path.encode()).digest()[0] % 12 == 0 else "train"


def _relpath_ok(path: str) -> bool:
    # The list names files inside the stdlib directory only.
    return not os.path.isabs(path) and ".." not in Path(path).parts


def make_file_list(stdlib_dir: Path, source: str) -> FileList:
    """List the top-level `*.py` modules of a stdlib directory (what `write_file_list` commits)."""
    paths = sorted(p.name for p in stdlib_dir.glob("*.py") if p.is_file())
    if not paths:
        raise CorpusError(f"no *.py files in {stdlib_dir}")
    entries = tuple(FileEntry(_split_for(p), _sha256(stdlib_dir / p), p) for p in paths)
    return FileList(entries, source)


def write_file_list(file_list: FileList, path: Path) -> None:
    lines = [LIST_HEADER, f"# source: {file_list.source}", f"# digest: {file_list.digest}",
             "# columns: split sha256 path (relative to the stdlib directory)"]
    lines += [f"{e.split} {e.sha256} {e.path}" for e in file_list.entries]
    path.write_text("\n".join(lines) + "\n")


def read_file_list(path: Path) -> FileList:
    text = Path(path).read_text()
    lines = text.splitlines()
    if not lines or lines[0] != LIST_HEADER:
        raise CorpusError(f"{path}: not a corpus file list (first line must be {LIST_HEADER!r})")
    source, digest, entries = "", None, []
    for n, line in enumerate(lines[1:], start=2):
        if line.startswith("# source:"):
            source = line.split(":", 1)[1].strip()
        elif line.startswith("# digest:"):
            digest = line.split(":", 1)[1].strip()
        elif line.startswith("#") or not line.strip():
            continue
        else:
            parts = line.split(" ", 2)
            if (len(parts) != 3 or parts[0] not in SPLITS or len(parts[1]) != 64
                    or not _relpath_ok(parts[2])):
                raise CorpusError(f"{path}:{n}: malformed line {line!r}")
            entries.append(FileEntry(*parts))
    fl = FileList(tuple(entries), source)
    if digest is not None and digest != fl.digest:
        raise CorpusError(f"{path}: digest line {digest[:12]}… does not match its entries "
                          f"({fl.digest[:12]}…); the list was edited by hand")
    if not any(e.split == "train" for e in entries) or not any(e.split == "val" for e in entries):
        raise CorpusError(f"{path}: the list needs both train and val files")
    return fl


def build_corpus(file_list: FileList, stdlib_dir: Path) -> Corpus:
    """Read and check every listed file; raise CorpusError naming what is missing or different."""
    missing, different = [], []
    parts: dict[str, list[torch.Tensor]] = {s: [] for s in SPLITS}
    eos = torch.tensor([EOS_ID], dtype=torch.int64)
    for e in file_list.entries:
        p = stdlib_dir / e.path
        if not p.is_file():
            missing.append(e.path)
            continue
        data = p.read_bytes()
        if hashlib.sha256(data).hexdigest() != e.sha256:
            different.append(e.path)
            continue
        parts[e.split] += [encode(data), eos]
    if missing or different:
        shown = ", ".join((missing + different)[:4])
        raise CorpusError(
            f"stdlib in {stdlib_dir} does not match the corpus list ({file_list.source}): "
            f"{len(missing)} missing, {len(different)} different (e.g. {shown}); pass --stdlib-dir "
            f"with that Python's Lib/ directory, or --corpus with a corpus file built where it matches")
    return Corpus(torch.cat(parts["train"]), torch.cat(parts["val"]), file_list.digest)


def save_corpus(corpus: Corpus, path: Path) -> None:
    """One portable file: int16 token arrays plus the list digest (safetensors metadata)."""
    from safetensors.torch import save_file

    save_file({"train": corpus.train.to(torch.int16), "val": corpus.val.to(torch.int16)},
              str(path), metadata={"digest": corpus.digest, "format": "refengine-corpus-v1"})


def load_corpus(path: Path, expected_digest: str) -> Corpus:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            train, val = f.get_tensor("train").long(), f.get_tensor("val").long()
    except Exception as exc:  # safetensors raises several types for a bad file
        raise CorpusError(f"{path}: not a readable corpus file ({exc})") from exc
    if meta.get("digest") != expected_digest:
        raise CorpusError(f"{path}: built from list digest {str(meta.get('digest'))[:12]}…, "
                          f"expected {expected_digest[:12]}…; rebuild it from the committed list")
    return Corpus(train, val, expected_digest)


def held_out_prompts(file_list: FileList, stdlib_dir: Path, n: int, prompt_bytes: int,
                     seed: int) -> list[dict]:
    """Prompts cut at line starts from the val files: ASCII, `prompt_bytes` long, reproducible."""
    import random

    rng = random.Random(seed)
    candidates: list[tuple[str, int, str]] = []
    for e in file_list.entries:
        if e.split != "val":
            continue
        text = (stdlib_dir / e.path).read_bytes()
        offset = 0
        for line in text.split(b"\n"):
            chunk = text[offset:offset + prompt_bytes]
            # A prompt starts at a non-blank line and holds code, not only a comment or docstring.
            if (len(chunk) == prompt_bytes and line.strip() and chunk.isascii()
                    and not line.lstrip().startswith((b"#", b'"', b"'"))):
                candidates.append((e.path, offset, chunk.decode("ascii")))
            offset += len(line) + 1
    if len(candidates) < n:
        raise CorpusError(f"only {len(candidates)} prompt candidates in the val files, need {n}")
    picked = rng.sample(candidates, n)
    return [{"id": f"heldout-{i:03d}", "source": f"{path}:{off}", "prompt": prompt}
            for i, (path, off, prompt) in enumerate(sorted(picked))]


def write_prompts(prompts: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))


def read_prompts(path: Path) -> list[dict]:
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
            raise CorpusError(f"{path}:{n}: each line needs a string 'prompt'")
        out.append(rec)
    return out


