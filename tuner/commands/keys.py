"""The API-key options every client command shares: --api-key, --api-key-file, $SPECDECODE_API_KEY.

Reading and checking the key file is probes.api_key (the engine's `serve` uses the same rules).
This module only wires the flags and turns a bad key file into the command's one-line error. It must
never print the key; `argv_for_record` (and `command_line`) is how a command line is stored or shown.
"""

from __future__ import annotations

import argparse
import shlex

from probes.api_key import ENV_VAR, ApiKeyError, redact_argv, resolve_api_key

__all__ = ["add_key_arguments", "api_key_of", "argv_for_record", "command_line", "ApiKeyError"]


def add_key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"sent as a bearer token (visible in ps: prefer --api-key-file or ${ENV_VAR})")
    parser.add_argument("--api-key-file", default=None, metavar="FILE",
                        help=f"read the key from FILE's first line (mode 600); default: ${ENV_VAR}")


def api_key_of(args: argparse.Namespace) -> str | None:
    """The key the command should send; ApiKeyError (one line, no key in it) when the file is bad."""
    return resolve_api_key(getattr(args, "api_key", None), getattr(args, "api_key_file", None))


def argv_for_record(argv: list[str], key: str | None) -> list[str]:
    """argv with the key replaced wherever it appears (also after an abbreviated flag such as
    `--api-ke K` or `--api=K`, which argparse accepts), and the value after any `--api...` flag."""
    out = redact_argv(argv, [key] if key else [])
    hide = False
    for i, a in enumerate(out):
        if hide:
            out[i] = "***"
            hide = False
        elif a.startswith("--api") and not a.startswith("--api-key-f"):
            flag, eq, _ = a.partition("=")
            if eq:
                out[i] = flag + "=***"
            else:
                hide = True
    return out


def command_line(argv: list[str], key: str | None = None) -> str:
    """The command line as a recording stores it: the key never, however it was spelled."""
    return "specdecode-tune " + " ".join(shlex.quote(a) for a in argv_for_record(argv, key))
