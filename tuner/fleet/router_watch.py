"""`--router` on the fleet screen: the router asked again every few seconds, its problems one line
in the screen's status line, its new workers added to the poller.

An overlay (tuner.fleet.overlays' shape: refresh, fill, notes) run by `Refreshing`: `refresh()` reads
`GET /workers` (tuner.fleet.router, bounded) and remembers one line when the router is down, slow or
answers something that is not sglang-router's worker list; a worker not yet in the fleet is added
(`FleetPoller.add`), one whose name is taken is left out with one line; a worker the router stopped
listing or marks unhealthy is said, while its row keeps saying what the server itself answers.
Whether a worker is really a server is its row's business (the poller connects to it). Must not draw,
print, or contact anything but the router.
"""

from __future__ import annotations

import threading
from typing import Any

from tuner.fleet.members import DuplicateName, Member
from tuner.fleet.router import RouterError, router_members
from tuner.fleet.rows import FleetRow

EVERY_S = 2.0      # a router that goes down shows within this (plus its read deadline)


class RouterWatch:
    """Args: url: the router; key: its API key (never shown); poller: set before the poller starts
    (what new workers are added to)."""

    def __init__(self, url: str, key: str | None = None) -> None:
        self.url, self._key = url, key
        self.poller: Any = None
        self._lock = threading.Lock()
        self._notes: list[str] = []

    def refresh(self) -> None:
        notes: list[str] = []
        try:
            workers = router_members(self.url, self._key)
        except RouterError as e:
            notes.append(f"{e} (asked again every {EVERY_S:g} s)")
            workers = []
        known = {m.url: m for m in self.poller.members} if self.poller is not None else {}
        for w in workers:
            if w.url in known:
                if w.labels.get("is_healthy") == "False":
                    notes.append(f"router marks {known[w.url].name} unhealthy")
                continue
            try:
                if self.poller is not None:
                    self.poller.add(w)
            except DuplicateName as e:
                notes.append(f"router worker {w.url} left out: {e}")
        listed = {w.url for w in workers}
        if workers:
            notes += [f"router no longer lists {m.name}" for m in known.values()
                      if m.source == "router" and m.url not in listed]
        with self._lock:
            self._notes = notes

    def fill(self, rows: list[FleetRow], members: list[Member]) -> list[FleetRow]:
        return rows

    def notes(self) -> list[str]:
        with self._lock:
            return list(self._notes)
