"""What the fleet's poller lays over its rows, each refreshed on a thread of its own so that
`FleetPoller.rows()` never waits on Prometheus or a disk.

An overlay has `refresh()` (may block: asks Prometheus, reads capture folders), `fill(rows, members)`
(pure over its last refresh) and `notes()` (one line per problem). `Refreshing(overlay, every_s)`
runs its refresh every `every_s` until closed; `for_fleet(members, prometheus=URL)` is the list
`attach`'s fleet screen uses: Prometheus' GPU readings, phase split and server states
(tuner.fleet.prom_overlay) where `--prometheus` is given, then the last trace capture's draft
collective share (tuner.fleet.trace_overlay). Must not draw or print.
"""

from __future__ import annotations

import threading
from typing import Any

from tuner.fleet.members import Member
from tuner.fleet.rows import FleetRow

PROMETHEUS_EVERY_S = 1.0   # a Prometheus-only server shows gone within a refresh of its failed scrape
TRACES_EVERY_S = 5.0       # a capture made in the single-server view shows on return within this


class Refreshing:
    """An overlay refreshed on its own daemon thread; start() refreshes once before returning, so
    the first rows are already filled. `closing`: what to close with it (a Prometheus client)."""

    def __init__(self, overlay: Any, every_s: float, closing: Any = None) -> None:
        self.overlay, self.every_s, self.closing = overlay, every_s, closing
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error = ""

    def start(self) -> "Refreshing":
        self.overlay.refresh()
        self._thread = threading.Thread(target=self._run, name=f"fleet-{type(self.overlay).__name__}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.overlay.refresh()
                self.error = ""
            except Exception as e:  # noqa: BLE001 - a bug here must not end the refreshing, nor pass unseen
                self.error = f"{type(self.overlay).__name__}: refresh failed: {type(e).__name__}: {str(e)[:160]}"

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)     # a refresh in flight ends within its deadline (5 s)
        if self.closing is not None:
            self.closing.close()

    def fill(self, rows: list[FleetRow], members: list[Member]) -> list[FleetRow]:
        return self.overlay.fill(rows, members)

    def notes(self) -> list[str]:
        return list(self.overlay.notes()) + ([self.error] if self.error else [])


def for_fleet(members: list[Member], prometheus: str | None = None) -> list[Refreshing]:
    """The fleet screen's overlays, not started (the poller starts and closes them).
    PrometheusError (one line) for a bad --prometheus URL."""
    from tuner.fleet.trace_overlay import TraceShareOverlay

    out = []
    if prometheus is not None:
        from tuner.fleet.prom_overlay import PrometheusOverlay
        from tuner.fleet.prometheus import PrometheusClient

        client = PrometheusClient(prometheus)
        out.append(Refreshing(PrometheusOverlay(client), PROMETHEUS_EVERY_S, closing=client))
    out.append(Refreshing(TraceShareOverlay(members), TRACES_EVERY_S))
    return out
