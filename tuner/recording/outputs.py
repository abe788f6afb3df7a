"""Output files of the commands (reports, exports, recordings, tune's JSON): what may be replaced,
whether the place is writable, and writing without leaving half a file.

The rules: an existing output is refused unless the caller allows overwriting; even then only a
regular file is replaced (never a directory, a device such as /dev/full, a FIFO) and never one of the
command's inputs (same file by inode, so hard links and other spellings count). Writability is
checked before the work (a test file in the target directory), and the write goes to a temporary
file beside the target that is renamed over it, so a full disk never leaves a cut file or destroys
the old one. Every failure is an OutputError with a one-line message. Must not import textual.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Mapping


class OutputError(Exception):
    """An output that cannot or must not be written; the message is one line naming the path."""


def same_file(a: Path, b: Path) -> bool:
    """True when both paths name one file (inode and device; hard links and symlinks included), or
    the same place when one does not exist yet (an input's -wal)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def unwritable_output(paths: Mapping[str, Path | None]) -> str | None:
    """"FLAG: why" for the first of `paths` (flag -> path, None: not asked for) that may not be
    written (an existing result is replaced), or None when every one may."""
    for flag, path in paths.items():
        try:
            if path is not None:
                check_output(path, overwrite=True, flag="")
        except OutputError as e:
            return f"{flag}: {e}"
    return None


def check_output(path: Path, *, overwrite: bool, inputs: Iterable[Path] = (), flag: str = "--overwrite",
                 may_replace: Callable[[Path], str | None] | None = None) -> None:
    """Raise OutputError unless `path` may be written.

    may_replace(path) -> None, or why this existing regular file is not something the command
    replaces (e.g. `record` replaces only recordings and empty files).
    """
    for src in inputs:
        if same_file(path, src):
            raise OutputError(f"{path} is the input {src}; refusing to write over it")
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            try:
                st = path.stat()
            except OSError as e:
                raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{path} is a directory; name a file to write")
        if not overwrite:
            raise OutputError(f"{path} exists (choose another path, or add {flag})")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{path} exists and is not a regular file; refusing to replace it")
        if may_replace is not None:
            why = may_replace(path)
            if why:
                raise OutputError(f"{path} {why}; refusing to replace it")
    check_writable_dir(path)


def check_writable_dir(path: Path) -> None:
    """The directory that will hold `path` exists and takes a new file (tried, not guessed: root and
    read-only mounts make permission bits lie)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".specdecode-probe-", dir=parent)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


def write_atomic(path: Path, write: Callable[[object], None], *, binary: bool = False) -> None:
    """Call write(file) on a temporary file beside `path`, then rename it over `path`.

    An error (disk full, permission) leaves `path` as it was and raises OutputError.
    """
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")) as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text))  # type: ignore[attr-defined]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
