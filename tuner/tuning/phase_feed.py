"""The tuner's own reader of the per-iteration phase stream (GET /specdecode/phases).

The session's backend turns the stream into per-poll averages for the panels; the cost model needs
every iteration with its configuration, batch size and accepted drafts, so the tuner keeps its own
cursor on the same endpoint (the stream is built for several readers). A background thread polls;
`poll()` hands over what arrived and never blocks, so a UI timer can drive the tuner.
Must not touch the store or the bus; errors become `last_error`, never an exception in `poll()`.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from tuner.backends.http import HttpClient, ServerError

PAGE = 1024


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

    def _page(self, after: int) -> dict:
        page: Any = self._http.get_json("/specdecode/phases", {"after": after, "limit": PAGE})
        if not isinstance(page, dict) or not isinstance(page.get("records"), list) \
                or not isinstance(page.get("next"), int):
            raise ServerError("/specdecode/phases answered something that is not a phase page")
        return page

    def _fetch(self) -> None:
        if self._cursor is None:
            # Skip the history the server still holds: page through to its newest record. A page
            # ends after `limit` records, not at the newest, so one page is not enough.
            page = self._page(0)
            while len(page["records"]) >= PAGE:
                page = self._page(page["next"])
            self._cursor = page["next"]
            return
        page = self._page(self._cursor)
        nxt = page["next"]
        restarted = nxt < self._cursor
        self._cursor = nxt
        if restarted:
            return                   # the server restarted: its sequence began again
        with self._lock:
            self.dropped += int(page.get("dropped") or 0)
            self._pending.extend(r for r in page["records"] if isinstance(r, dict))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._fetch()
                self.last_error = ""
            except ServerError as e:
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
