"""The tuner's own reader of the per-iteration phase stream (GET /specdecode/phases).

The session's backend turns the stream into per-poll averages for the panels; the cost model needs
every iteration with its configuration, batch size and accepted drafts, so the tuner keeps its own
cursor on the same endpoint (the stream is built for several readers), paged by the same rule
(tuner.backends.phase_pages). A background thread polls;
`poll()` hands over what arrived and never blocks, so a UI timer can drive the tuner.
Must not touch the store or the bus; errors become `last_error`, never an exception in `poll()`.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from tuner.backends import phase_pages
from tuner.backends.http import HttpClient, ServerError


class PhaseFeed(Protocol):
    def poll(self) -> list[dict]:
        """Records that arrived since the last call (stream order)."""
        ...

    def close(self) -> None: ...


class HttpPhaseFeed:
    """Polls `{url}/specdecode/phases?after=SEQ` every `interval` s on a daemon thread.

    History from before the feed started is skipped (it describes the past, not the probes).
    """

    def __init__(self, url: str, api_key: str | None = None, interval: float = 0.2) -> None:
        self._http = HttpClient(url, api_key)
        self._interval = interval
        self._lock = threading.Lock()
        self._pending: list[dict] = []
        self._cursor: int | None = None
        self.dropped = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-phase-feed", daemon=True)
        self._thread.start()

    def _page(self, after: int) -> Any:
        return self._http.get_json("/specdecode/phases", {"after": after, "limit": phase_pages.PAGE_LIMIT})

    def _fetch(self) -> None:
        # The shared paging rule: the backlog on arrival, and a restarted server's first page, are
        # history (they describe the past, not the probes).
        pages, history = phase_pages.read(self._page, self._cursor)
        self._cursor = pages[-1].next
        if history:
            return
        with self._lock:
            self.dropped += pages[-1].dropped
            self._pending.extend(dict(r) for r in pages[-1].records)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._fetch()
                self.last_error = ""
            except (ServerError, ValueError) as e:
                self.last_error = str(e)
            self._stop.wait(self._interval)

    def poll(self) -> list[dict]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._http.close()
