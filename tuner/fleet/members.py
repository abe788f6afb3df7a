"""Member: one server of a fleet, however the fleet was named.

Every discovery path (command-line URLs, `--fleet FILE`, `--router URL`, `--prometheus URL`) returns
a list of these; names are unique within a fleet (`unique_names` checks, with one line naming the
duplicate). Must not open connections: discovery modules do that, this is only the shape.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Member:
    """One server. `url` is its HTTP base (no trailing slash, no /metrics); `api_key_file` names
    where its key lies (never the key itself); `source` says how it was found ("url", "fleet-file",
    "router", "prometheus"); `labels` carries what discovery knew (router load, Prometheus labels)."""

    name: str
    url: str
    api_key_file: Path | None = None
    source: str = "url"
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


def default_name(url: str) -> str:
    """host:port of a URL: the name a server gets when nobody named it."""
    parts = urlsplit(url)
    return parts.netloc or url


class DuplicateName(ValueError):
    """Two members of one fleet share a name."""


def unique_names(members: Iterable[Member]) -> list[Member]:
    """The members, in order, refusing a repeated name with one line."""
    out: list[Member] = []
    seen: dict[str, str] = {}
    for m in members:
        if m.name in seen:
            raise DuplicateName(f"fleet: server name {m.name!r} is used twice ({seen[m.name]} and {m.url})")
        seen[m.name] = m.url
        out.append(m)
    return out


def ask_each(members: Iterable[Member], ask: Callable[[Member], Any], deadline_s: float,
             what: str = "ask") -> dict[str, Any]:
    """`ask(member)` for every member at once, each on its own daemon thread, waiting at most
    `deadline_s` for each: {name: answer} for those that answered in time (a hung one is left out,
    never waited for beyond its deadline)."""
    answers: dict[str, Any] = {}
    lock = threading.Lock()

    def one(m: Member) -> None:
        r = ask(m)
        with lock:
            answers[m.name] = r

    threads = [threading.Thread(target=one, args=(m,), daemon=True, name=f"{what}-{m.name}") for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s)
    with lock:
        return dict(answers)
