"""Secrets out of server descriptions before anything is shown, stored, recorded or reported.

One rule for the live side (/server_info as it arrives) and the report (a recording's launch
values): a text value under a secret-looking key is replaced by ***, at any depth, and so is the
value after a secret-looking flag inside a command-line string or an argv list, and the password
of a URL's userinfo (`http://user:***@host`). A key is
secret-looking when it names a key, a token, a password or a secret (a tokenizer is none of them).
Numbers and booleans are kept: they are counts and switches (`max_total_tokens`,
`num_key_value_heads`), not credentials.
Must not do anything else to the values: callers decide what to show.
"""

from __future__ import annotations

import re
from typing import Any

SECRET_HINTS = ("key", "token", "password", "passwd", "secret")
# Part of names that contains a hint but names no secret: a tokenizer (its path or mode).
NOT_SECRET = ("tokenizer",)
# A secret flag inside a command-line string (SGLang's launch_command, a wrapper's argv): the flag,
# abbreviated or not (`--api-key K`, `--api-ke=K`, `--admin-api-key K`, `--hf-token K`), then its value.
_SECRET_FLAG = re.compile(
    r"""(--?[\w-]*(?:api[-_]?k(?:ey?)?|token|passw(?:or)?d|secret)[\w-]*)(=|\s+)("[^"]*"|'[^']*'|\S+)""",
    re.IGNORECASE)
MAX_DEPTH = 64
# A URL's userinfo password (`http://user:PASS@host`): httpx sends it as basic auth, so it is as
# secret as a key. The user name stays; the password becomes ***.
_URL_PASSWORD = re.compile(r"""(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@"'<>]*):[^/\s@"'<>]*@""")


def is_secret_key(k: Any) -> bool:
    """True for a key whose text value must not be shown (api_key, hf_token, ssl_keyfile, password...)."""
    low = k.lower() if isinstance(k, str) else ""
    for part in NOT_SECRET:
        low = low.replace(part, "")
    return any(h in low for h in SECRET_HINTS)


def redact_url(text: str) -> str:
    """`text` with the password of every URL's userinfo replaced by *** (`http://u:***@h`)."""
    return _URL_PASSWORD.sub(r"\1:***@", text) if "://" in text else text


def redact_text(text: str) -> str:
    """`text` with the value after any secret-looking flag, and any URL's password, replaced by ***."""
    return redact_url(_SECRET_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text))


def redact(d: Any, _depth: int = 0) -> Any:
    """A copy of `d` with secrets replaced by ***: values under secret-looking keys, and flag values
    inside strings that look like command lines, at any depth (lists of argv included)."""
    if _depth > MAX_DEPTH:
        return "***"
    if isinstance(d, dict):
        return {k: "***" if v and is_secret_key(k) and not isinstance(v, (bool, int, float))
                else redact(v, _depth + 1) for k, v in d.items()}
    if isinstance(d, list):
        out, hide = [], False
        for v in d:
            if hide:
                out.append("***")
                hide = False
                continue
            if isinstance(v, str) and v.startswith("-") and "=" not in v and _SECRET_FLAG.match(v + " x"):
                hide = True          # an argv list: the next element is the secret
            out.append(redact(v, _depth + 1))
        return out
    if isinstance(d, tuple):
        return tuple(redact(list(d), _depth))
    if isinstance(d, str):
        return redact_text(d)
    return d
