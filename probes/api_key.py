"""Where an API key comes from, for `serve` and every client: a flag, a file or the environment.

`--api-key-file FILE` (its first line) keeps the key out of `ps`, shell history and process listings;
`SPECDECODE_API_KEY` does the same for scripts. A key file that group or others may read is refused,
as ssh refuses a private key others can read. Standard library only (the engine and the tuner both
use it); it must never print, log or put the key in an error message.
"""

from __future__ import annotations

import os
import stat

ENV_VAR = "SPECDECODE_API_KEY"
MAX_KEY_FILE_BYTES = 64 * 1024


class ApiKeyError(ValueError):
    """The key cannot be read as asked (one line, without the key)."""


def read_key_file(path: str) -> str:
    """The first line of `path`, stripped. Refuses a file group/others can access, or an empty one."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))   # a FIFO must not block
    except OSError as e:
        raise ApiKeyError(f"cannot read --api-key-file {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ApiKeyError(f"--api-key-file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise ApiKeyError(f"--api-key-file {path} can be accessed by group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}")
        data = os.read(fd, MAX_KEY_FILE_BYTES)
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiKeyError(f"--api-key-file {path} is not UTF-8 text") from None
    key = text.splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise ApiKeyError(f"--api-key-file {path}: the first line is empty")
    return key


def key_problem(key: str) -> str | None:
    """Why `key` cannot go in an `Authorization: Bearer` header, or None; never holds the key.
    HTTP header values are visible ASCII and spaces: a control character (a newline from `echo`)
    made the HTTP library print the header, key and all; a non-ASCII one read as a bad URL."""
    bad = next((c for c in key if not " " <= c <= "~"), None)
    if bad is None:
        return None
    return "a control character" if bad < " " or bad == "\x7f" else "a non-ASCII character"


def checked_key(key: str | None, source: str) -> str | None:
    """`key` stripped of surrounding whitespace (None when nothing is left); ApiKeyError in one line
    without the key when what is left cannot be sent."""
    if key is None:
        return None
    key = key.strip()
    if not key:
        return None
    problem = key_problem(key)
    if problem is not None:
        raise ApiKeyError(f"the API key from {source} holds {problem}; an HTTP header takes printable "
                          "ASCII only")
    return key


def resolve_api_key(flag: str | None, key_file: str | None, environ: dict | None = None) -> str | None:
    """The key to use: --api-key, else --api-key-file, else $SPECDECODE_API_KEY, else None; stripped,
    and refused (one line, without the key) when it holds a control or non-ASCII character.

    Giving both --api-key and --api-key-file is refused (which one was meant?).
    """
    if flag and key_file:
        raise ApiKeyError("give --api-key or --api-key-file, not both")
    if flag:
        return checked_key(flag, "--api-key")
    if key_file:
        return checked_key(read_key_file(key_file), f"--api-key-file {key_file}")
    env = os.environ if environ is None else environ
    return checked_key(env.get(ENV_VAR), f"${ENV_VAR}")


def redact_argv(argv: list[str], secrets: list[str]) -> list[str]:
    """`argv` with every element holding one of `secrets` replaced: `--api-ke=K` -> `--api-ke=***`,
    a bare `K` -> `***`. Redacting by value catches abbreviated flags argparse accepted."""
    out = []
    for a in argv:
        for s in secrets:
            if s and s in a:
                a = a.replace(s, "***")
        out.append(a)
    return out
