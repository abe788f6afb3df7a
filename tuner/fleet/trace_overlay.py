"""What the last trace capture adds to the fleet's rows: the draft's collective share, with the
capture's age, for a server whose own phase stream (and Prometheus) gives none, as on SGLang, whose
plugin cannot split the collectives inside its CUDA graphs.

`TraceShareOverlay(members).refresh()` reads the saved shares once for the whole fleet
(tuner.core.trace_share: one scan of the capture folders, every server's newest); `fill(rows, members)` (pure over that
answer) sets `draft_comm_pct` and `draft_comm_trace_age_s` where the row has no share. Must not
contact a server.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from tuner.core.trace_share import TraceShare, saved_shares, url_key
from tuner.fleet.members import Member
from tuner.fleet.rows import FleetRow


class TraceShareOverlay:
    # Every saved share is kept (a few per capture folder), so a member added later (a router's
    # worker that registered after start) is looked up like the others.
    def __init__(self, members: list[Member], root: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.root, self.clock = root, clock
        self.shares: dict[str, TraceShare] = {}

    def refresh(self) -> None:
        self.shares = saved_shares(self.root)

    def notes(self) -> list[str]:
        return []

    def fill(self, rows: list[FleetRow], members: list[Member]) -> list[FleetRow]:
        url = {m.name: url_key(m.url) for m in members}
        shares, now = self.shares, self.clock()
        out = []
        for r in rows:
            share = shares.get(url.get(r.name, ""))
            if r.draft_comm_pct is None and share is not None:
                r = replace(r, draft_comm_pct=share.pct, draft_comm_trace_age_s=share.age_s(now))
            out.append(r)
        return out
