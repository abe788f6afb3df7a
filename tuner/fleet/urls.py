"""One rule for a server URL named by a person or a router: http(s), a host, no path, no query.

Used by every discovery path (command line, fleet file, router), so a URL that is not a server's
HTTP base is refused the same way everywhere, with one line that never shows a password.
Must not open connections.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tuner.core.redact import redact_url
from tuner.core.text import terminal_safe

MAX_URL_CHARS = 2048


class UrlError(ValueError):
    """Not a server's HTTP base (one line, password-free)."""


def checked_url(value: Any) -> str:
    """`value` as a server base URL without a trailing slash; UrlError when it is not one."""
    if not isinstance(value, str) or not value.strip():
        raise UrlError("no url")
    text = value.strip()
    shown = terminal_safe(redact_url(text))[:120]
    if len(text) > MAX_URL_CHARS:
        raise UrlError(f"url longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise UrlError(f"not a URL: {shown!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlError(f"not an http(s) URL with a host: {shown!r}")
    if parts.path.rstrip("/") or parts.query or parts.fragment:
        raise UrlError(f"a server URL has no path or query: {shown!r}")
    del port
    return text.rstrip("/")
