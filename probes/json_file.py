"""The one reader of JSON input files an operator names (serve's adaptive config and acceptance
profile, and any other JSON a command reads whole): bounded, non-blocking, one line on any error.

Regular files only (a FIFO or /dev/zero would block or never end), opened non-blocking and checked
with fstat before a byte is read; at most `cap` bytes; nesting bounded before parsing (json
recurses per level); every decoding failure (bad UTF-8, bad JSON, an integer past Python's
4300-digit limit) becomes JsonFileError naming the file. Standard library only: it loads in the
engine's HTTP process, an SGLang server and the tuner alike.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

MAX_BYTES = 16 << 20
MAX_DEPTH = 256


class JsonFileError(ValueError):
    """The file cannot be read as JSON (one line, naming the file)."""


def _depth_over(text: str, limit: int) -> bool:
    """True if brackets nest deeper than `limit` outside strings (a linear scan, no parse)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def read_bytes(path: str | os.PathLike, cap: int = MAX_BYTES) -> bytes:
    """A regular file's bytes, at most `cap` of them. Raises JsonFileError."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise JsonFileError(f"cannot read {name}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
            raise JsonFileError(f"{name}: {what}, not a JSON file")
        chunks, got = [], 0
        while got <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as e:
        raise JsonFileError(f"cannot read {name}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if got > cap:
        raise JsonFileError(f"{name}: larger than {cap >> 20} MiB, not a JSON input")
    return b"".join(chunks)


def read_json(path: str | os.PathLike, cap: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON file's value. Raises JsonFileError (one line naming the file)."""
    name = os.fspath(path)
    raw = read_bytes(path, cap)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise JsonFileError(f"{name}: not UTF-8 text") from None
    if _depth_over(text, max_depth):
        raise JsonFileError(f"{name}: not JSON (nested deeper than {max_depth} levels)")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise JsonFileError(f"{name}: not JSON ({str(e).splitlines()[0][:200]})") from None
