"""SGLang-style API-key check: `Authorization: Bearer KEY` on every route except health, ready and metrics.

Pure logic over a header value; it must not log or echo the key.
"""

from __future__ import annotations

import hmac

# SGLang's middleware lets health and readiness probes and Prometheus scrapes through without the
# key (utils/auth.py:102-104).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def needs_key(path: str) -> bool:
    return not path.startswith(OPEN_PREFIXES)


def authorized(api_key: str | None, path: str, authorization: str | None) -> bool:
    if not api_key or not needs_key(path):
        return True
    if not authorization:
        return False
    # Constant-time comparison so the key cannot be guessed byte by byte from timing.
    return hmac.compare_digest(authorization.encode(), f"Bearer {api_key}".encode())
