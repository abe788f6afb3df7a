"""`--router URL`: the workers sglang-router 0.3.x knows, read from its own API, as Members.

sglang-router 0.3.2 (the wheel's README, "Administrative & Worker APIs") answers `GET /workers` with
`{"workers": [{"id", "url", "model_id", "is_healthy", "load", "worker_type", "connection_mode",
"metadata", ...}], "total": N, "stats": {...}}`; tests/fleet/fixtures/router_workers.json is the
real binary's answer in front of two `serve` processes. Each worker becomes a Member named host:port,
its router facts (healthy, load, model, type) in `labels`.

One read, bounded like every read (tuner.backends.http); a router that is down, slow or answers
something else is one RouterError line. A worker whose url is not a server's base is refused by
name; whether it is really a server is the poller's finding (it connects), not this module's.
Must not contact the workers.
"""

from __future__ import annotations

from typing import Any

from tuner.backends.http import BadAnswer, HttpClient, ServerError, ServerSlow, ServerUnreachable
from tuner.core.redact import redact_url
from tuner.core.text import terminal_safe
from tuner.fleet.members import Member, default_name, unique_names
from tuner.fleet.urls import UrlError, checked_url

ROUTER_TIMEOUT_S = 2.0
ROUTER_DEADLINE_S = 3.0
MAX_WORKERS = 1024
LABEL_KEYS = ("is_healthy", "load", "model_id", "worker_type", "connection_mode")


class RouterError(ValueError):
    """The router's worker list cannot be had (one line, key-free)."""


def parse_workers(body: Any, where: str = "router") -> list[Member]:
    """Members from a `GET /workers` body; RouterError when it is not sglang-router's shape."""
    if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        raise RouterError(f"{where}: GET /workers is not sglang-router's answer (no \"workers\" list)")
    workers = body["workers"]
    if len(workers) > MAX_WORKERS:
        raise RouterError(f"{where}: GET /workers lists {len(workers)} workers (at most {MAX_WORKERS})")
    members = []
    for i, w in enumerate(workers):
        if not isinstance(w, dict):
            raise RouterError(f"{where}: worker {i} of GET /workers is not an object")
        try:
            url = checked_url(w.get("url"))
        except UrlError as e:
            raise RouterError(f"{where}: worker {i} of GET /workers: {e}") from None
        labels = {k: terminal_safe(str(w[k]))[:80] for k in LABEL_KEYS if k in w}
        members.append(Member(default_name(url), url, source="router", labels=labels))
    try:
        return unique_names(members)
    except ValueError as e:
        raise RouterError(f"{where}: {e}") from None


def router_members(url: str, api_key: str | None = None, *, timeout: float = ROUTER_TIMEOUT_S,
                   deadline: float = ROUTER_DEADLINE_S) -> list[Member]:
    """The router's workers now. RouterError: down, slow, not a router, or no workers."""
    try:
        base = checked_url(url)
    except UrlError as e:
        raise RouterError(f"--router: {e}") from None
    where = f"router {terminal_safe(redact_url(base))}"
    try:
        client = HttpClient(base, api_key, timeout=timeout, deadline=deadline)
    except ServerError as e:
        raise RouterError(f"{where}: {e}") from None
    try:
        body = client.get_json("/workers")
    except ServerUnreachable as e:
        raise RouterError(f"{where} is down: {e}") from None
    except ServerSlow as e:
        raise RouterError(f"{where} is too slow: {e}") from None
    except BadAnswer as e:
        raise RouterError(f"{where} is not sglang-router 0.3.x: {e}") from None
    except ServerError as e:
        raise RouterError(f"{where}: {e}") from None
    finally:
        client.close()
    members = parse_workers(body, where)
    if not members:
        raise RouterError(f"{where} has no workers registered")
    return members
