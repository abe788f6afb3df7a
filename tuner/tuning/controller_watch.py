"""Watching the server's own adaptive controller while a face runs: every few seconds, a
`controller_check` event (tuner.tuning.controller_check's JSON) on the session's bus, so the TUI
shows it, and a recording (hence the report) keeps it.

It does nothing until the server says it runs `--speculative-adaptive` (its active config or launch
arguments) or a phase record says `adaptive: true`. Then, with a phase stream (our engine; SGLang
with our plugin), it reads the stream with its own cursor (tuner.tuning.phase_feed, as the tuner
does: it needs every record) and checks tiers from the records against the per-bucket fit; without
one it pairs the store's `sglang:spec_num_steps` and running-requests gauges (approximate, no fit).
In managed mode the SGLang log's tier lines can be fed in as (batch size, steps) pairs
(`add_log_pairs`); they are used where the records say nothing adaptive.
`step()` never blocks (the feed polls on its own thread); the driver calls it from its tick. Must
not touch widgets or decide anything about tuning.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from probes.names import PINNED_STEPS
from tuner.core import series as S
from tuner.core.records import Event
from tuner.tuning import controller_check as cc
from tuner.tuning.observations import Iteration, parse_record, settle

EVERY_S = 5.0
MAX_ITERS = 6000
"""Iterations kept for the fit (the newest): enough for every bucket a load sweep visits, small
enough that a refit every few seconds stays a few tens of milliseconds on the ticking thread."""
GAUGE_WINDOW_S = 600.0


def is_adaptive(info: Mapping[str, Any]) -> bool:
    """The server runs an adaptive controller, as /server_info (normalised) says."""
    active = info.get("active") or {}
    launch = info.get("launch") or {}
    return bool(info.get("adaptive") or active.get("speculative_adaptive") is True
                or launch.get("speculative_adaptive") is True)


class ControllerWatch:
    def __init__(self, session: Any, feed_factory: Callable[[], Any] | None = None,
                 every_s: float = EVERY_S, max_iters: int = MAX_ITERS) -> None:
        self.session = session
        self.every_s = every_s
        self._feed_factory = feed_factory
        self._feed: Any = None
        self._mode: str | None = None        # None until adaptive: "records" | "gauges"
        self._iters: deque[Iteration] = deque(maxlen=max_iters)
        self._log_pairs: deque[tuple[int, int]] = deque(maxlen=max_iters)
        self._seen_adaptive = False
        self._new = 0                        # iterations since the last check
        self._last_t = float("-inf")
        self._last_doc: dict | None = None
        self.checks = 0

    def _adaptive(self) -> bool:
        if self._seen_adaptive:
            return True
        info = self.session.server_info() if hasattr(self.session, "server_info") else {}
        active = self.session.active_config() if hasattr(self.session, "active_config") else {}
        return is_adaptive(info) or active.get("speculative_adaptive") is True

    def _pinned(self) -> bool:
        active = self.session.active_config() if hasattr(self.session, "active_config") else {}
        pin = active.get(PINNED_STEPS)
        return isinstance(pin, int) and not isinstance(pin, bool) and pin >= 0

    def _start(self) -> None:
        backend = getattr(self.session, "backend", None)
        caps = getattr(backend, "capabilities", None)
        if self._feed_factory is not None:
            self._feed, self._mode = self._feed_factory(), cc.RECORDS
        elif caps is not None and caps.HAS_PHASE_STREAM and getattr(backend, "url", None):
            from tuner.tuning.phase_feed import HttpPhaseFeed
            self._feed, self._mode = HttpPhaseFeed(backend.url, getattr(backend, "api_key", None)), cc.RECORDS
        else:
            self._mode = cc.GAUGES

    def step(self, now: float | None = None) -> None:
        if self._mode is None:
            if not self._adaptive():
                return
            self._start()
        now = self.session.now() if now is None else now
        if self._feed is not None:
            records = self._feed.poll()
            # Plugins before `adaptive` was in their records: on an adaptive server the records'
            # tiers are the controller's, unless the plugin pins one (specdecode_num_steps >= 0).
            by_server = self._adaptive() and not self._pinned() if records else False
            for rec in records:
                try:
                    it = parse_record(rec)
                except ValueError:
                    continue          # the tuner and the panels say what is wrong with a record
                if "adaptive" not in rec and by_server:
                    it = replace(it, adaptive=True)
                self._seen_adaptive = self._seen_adaptive or it.adaptive
                self._iters.append(it)
                self._new += 1
        if now - self._last_t < self.every_s:
            return
        if self._mode == cc.RECORDS and not self._new:
            return                    # nothing new since the last check: the refit (~0.1 s) would repeat it
        self._new = 0
        self._last_t = now
        doc = self._check(now)
        if doc is not None and doc != self._last_doc:
            self._last_doc = doc
            self.checks += 1
            self.session.put(Event(now, cc.EVENT_KIND, doc))

    def add_log_pairs(self, pairs: Iterable[tuple[int, int]]) -> None:
        """(batch size, steps) read from SGLang's own log lines (managed mode; the parser lives with
        the SGLang backend). Used where the phase records say nothing adaptive; not approximate."""
        pairs = list(pairs)
        self._log_pairs.extend(pairs)
        self._new += len(pairs)
        self._seen_adaptive = self._seen_adaptive or bool(self._log_pairs)

    def _check(self, now: float) -> dict | None:
        if self._mode == cc.RECORDS:
            doc = cc.check_from_iterations(settle(list(self._iters)))
            if doc is not None or not self._log_pairs:
                return doc
        if self._log_pairs:
            return cc.check_from_pairs(list(self._log_pairs), cc.LOG, settle(list(self._iters)))
        store = self.session.store
        running = store.window(S.SERVER_RUNNING, now - GAUGE_WINDOW_S, now)
        steps = store.window(S.SPEC_NUM_STEPS, now - GAUGE_WINDOW_S, now)
        pairs = cc.pairs_from_gauges(list(zip(running.t, running.v)), list(zip(steps.t, steps.v)))
        if not pairs:
            return None
        return cc.check(cc.chosen_tiers(pairs), None, cc.GAUGES)

    def close(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None
