"""The session: one backend, one bus, one store, optionally a recorder and a load driver.

Producers (the backend's pollers, samplers, the load driver) put records on the bus from their own
threads; `tick()` drains the bus on the caller's thread into the store and the recorder. The TUI calls
tick() from its timer, the headless `record` from a plain loop. The session owns no Textual and no
measuring logic; it must not be ticked from two threads.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from tuner.core import ab as _ab
from tuner.core import series as S
from tuner.core.bus import Bus
from tuner.core.clock import Clock, SystemClock
from tuner.core.events import EventKind
from tuner.core.records import Event, Record, thaw
from tuner.core.store import Store

if TYPE_CHECKING:   # only for type hints: the core does not depend on backends at import time
    from tuner.backends.base import Backend, ControlResult
    from tuner.backends.load import LoadDriver


class RecordSink(Protocol):
    """What the session hands drained records to (tuner.recording.Recorder)."""

    def write(self, records: list[Record]) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Connection:
    """The connection state as the store knows it (works the same on replay):
    connecting | connected | degraded (reason) | disconnected."""

    connected: bool
    since: float          # session time of the last state change, NaN before any
    error: str = ""
    degraded: str = ""    # why the server counts as too slow (connected stays True: it answers)

    @property
    def state(self) -> str:
        """"connecting", "connected", "degraded" or "disconnected"."""
        if math.isnan(self.since):
            return "connecting"
        if not self.connected:
            return "disconnected"
        return "degraded" if self.degraded else "connected"

    def text(self) -> str:
        """"connecting", "connected", "degraded (reason)" or "disconnected since 12:34:56 UTC (reason)"."""
        state = self.state
        if state == "degraded":
            return f"degraded ({self.degraded})"
        if state != "disconnected":
            return state
        since = time.strftime("%H:%M:%S", time.gmtime(self.since))
        return f"disconnected since {since} UTC ({self.error})"


class Session:
    """Bus + store (+ backend, recorder, load driver) around one injected clock.

    Args:
        backend: the server (or recording) to read from; None for a bare store fed by hand.
        clock: where time comes from; defaults to the backend's clock, else the system clock.
        store: a Store to fill (a new one by default).
        recorder: receives every drained record in order (tuner.recording.Recorder).
    """

    def __init__(self, backend: Backend | None = None, *, clock: Clock | None = None,
                 store: Store | None = None, recorder: RecordSink | None = None) -> None:
        self.backend = backend
        self.clock: Clock = clock or getattr(backend, "clock", None) or SystemClock()
        self.bus = Bus()
        self.store = store if store is not None else Store()
        self.recorder = recorder
        self.load: LoadDriver | None = None
        self.load_defaults: dict[str, Any] = {}    # LoadDriver keywords every start_load gets (e.g. rate)
        self._started = False

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> "Session":
        """Start the backend's pollers (idempotent)."""
        if not self._started and self.backend is not None:
            self.backend.start(self.bus, self.clock)
        self._started = True
        return self

    def close(self) -> None:
        """Stop the load and the backend, drain what they said, close the recording."""
        if self.load is not None:
            self.load.stop()
        if self.backend is not None:
            self.backend.stop()       # also releases connections of a backend that never started
        self._started = False
        self.tick()
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None

    def __enter__(self) -> "Session":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one place records move ---------------------------------------------------------------

    def tick(self, limit: int | None = None) -> int:
        """Move queued records into the store and the recorder; returns how many moved.

        A backend that produces on the caller's thread (replay) is pumped first. The store's revision
        goes up when anything moved.
        """
        if self.backend is not None:
            self.backend.pump()
        records = self.bus.drain(limit)
        if records:
            self.store.add_many(records)
            if self.recorder is not None:
                self.recorder.write(records)
        return len(records)

    def now(self) -> float:
        return self.clock.now()

    def put(self, record: Record) -> None:
        """Add a record of the caller's own (e.g. a sampler run by the app)."""
        self.bus.put(record)

    def note(self, text: str) -> None:
        self.bus.put(Event(self.now(), EventKind.NOTE, {"text": text}))

    # -- control (blocking: call from a worker thread, never the UI thread) ------------------------

    def set_config(self, changes: Mapping[str, Any], by: str = "operator") -> ControlResult:
        """Ask the server for a new active configuration; see Backend.set_config."""
        if self.backend is None:
            raise RuntimeError("no backend")
        return self.backend.set_config(changes, by=by)

    def start_load(self, prompts: list[dict], concurrency: int, max_new_tokens: int = 128,
                   **kwargs: Any) -> LoadDriver:
        """Start (or restart) the load driver against the backend's server."""
        from tuner.backends.load import LoadDriver   # the driver needs httpx; the bare core does not
        if self.backend is None or not getattr(self.backend, "url", None):
            raise RuntimeError("the load driver needs a live server")
        self.stop_load()
        kwargs = {**self.load_defaults, **kwargs}
        # Without a phase stream (SGLang without the plugin), acceptance by context bucket comes
        # from the finished requests' own statistics; with one, the records' per-round ctx does.
        caps = getattr(self.backend, "capabilities", None)
        kwargs.setdefault("context_buckets", not getattr(caps, "HAS_PHASE_STREAM", False))
        launch = (getattr(self.backend, "info", {}) or {}).get("launch") or {}
        kwargs.setdefault("incremental", bool(launch.get("incremental_streaming_output")))
        self.load = LoadDriver(self.backend.url, self.bus, self.clock, prompts, concurrency,
                               max_new_tokens=max_new_tokens, api_key=getattr(self.backend, "api_key", None),
                               **kwargs)
        self.load.start()
        return self.load

    def stop_load(self) -> None:
        if self.load is not None:
            self.load.stop()
            self.load = None

    # -- replay -----------------------------------------------------------------------------------

    def seek(self, t: float) -> None:
        """Replay only: show the recording as it stood at time t."""
        if self.backend is None or not self.backend.can_seek:
            raise RuntimeError("this backend cannot seek")
        self.bus.drain()
        self.store.clear()
        self.backend.seek(t)
        self.tick()

    # -- views over the store (same answers live and on replay) -----------------------------------

    def throughput_series(self, at: float = math.inf) -> str:
        """The tok/s series A/B uses: the load driver's client count when it runs (at `at`, default
        now), else the server's."""
        started = self.store.last_event(EventKind.LOAD_STARTED, at=at)
        stopped = self.store.last_event(EventKind.LOAD_STOPPED, at=at)
        if started is not None and (stopped is None or started.t > stopped.t):
            return S.LOAD_TOK_PER_S
        return S.SERVER_TOK_PER_S

    def ab(self, series: str | None = None, now: float | None = None, baseline_at: float | None = None
           ) -> _ab.ABResult:
        """Before/after the last config change for a series (default: decode tok/s, counted by the
        load driver when it ran at the change: its sides end where the load started or stopped, and
        the report ranks by the same count). baseline_at: the setting that ran then against the one
        running now, instead of the previous one (tuner.core.ab.compare_with_baseline)."""
        now = self.now() if now is None else now
        if series is None:
            change = self.store.last_event(EventKind.CONFIG_CHANGED, at=now)
            series = self.throughput_series(change.t if change is not None else now)
        if baseline_at is not None:
            return _ab.compare_with_baseline(self.store, series, now, baseline_at)
        return _ab.compare_last_change(self.store, series, now)

    def server_info(self) -> dict:
        """The newest server_info event's data (kind, version, model, tp_size, launch, active, ...)."""
        e = self.store.last_event(EventKind.SERVER_INFO)
        return {} if e is None else thaw(e.data)

    def active_config(self) -> dict:
        """The active knobs (steps, topk, draft tokens, placement) as the server last reported them."""
        e = self.store.last_event((EventKind.SERVER_INFO, EventKind.CONFIG_CHANGED, EventKind.CONFIG_ACTIVE))
        if e is None:
            return {}
        key = {EventKind.SERVER_INFO: "active", EventKind.CONFIG_CHANGED: "new", EventKind.CONFIG_ACTIVE: "active"}[e.kind]
        return thaw(e.data.get(key) or {})

    def connection(self) -> Connection:
        e = self.store.last_event((EventKind.CONNECTED, EventKind.DISCONNECTED, EventKind.DEGRADED))
        if e is None:
            return Connection(False, math.nan)
        if e.kind == EventKind.CONNECTED:
            return Connection(True, e.t)
        if e.kind == EventKind.DEGRADED:
            return Connection(True, e.t, degraded=str(e.data.get("reason", "") or "slow"))
        return Connection(False, float(e.data.get("since", e.t)), str(e.data.get("error", "")))
