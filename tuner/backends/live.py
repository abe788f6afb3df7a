"""What live servers share: three pollers (/metrics, /server_info, the phase stream), the connection
state, active-config read-back and the /set_internal_state round trip.

Subclasses (refengine, sglang) say what the server kind can do and how to read its replies. Pollers
run on daemon threads and only put records on the bus; a poll that fails becomes a state
(disconnected, poll_error), never an exception in a caller. Must not touch the store.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from abc import abstractmethod
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from tuner.backends.base import Backend, Capabilities, ConnectionMonitor, ConnectionState, ControlResult
from tuner.backends import phase_pages
from tuner.backends.derive import MetricsDeriver, PhaseStreamReader
from tuner.backends.latency_buckets import LatencyBuckets
from tuner.backends.http import (DEFAULT_DEADLINE_S, AnswerTooLarge, BadAnswer, HttpClient, ServerError, ServerSlow,
                                 ServerUnreachable)
from tuner.backends.promtext import MetricsParseError, parse_metrics, rank_info
from tuner.core import setting as vocab
from tuner.core.bus import Bus
from tuner.core.clock import Clock, SystemClock
from tuner.core.events import EventKind
from tuner.core.records import Event, Record, thaw
from tuner.core.text import terminal_safe

METRICS_RETRY_S = 5.0
"""How often a server whose /metrics answered 404 is asked again (a relaunch may add it)."""

METRICS_INTERVAL_S = 0.25
PHASES_INTERVAL_S = 0.25
INFO_INTERVAL_S = 1.0
PHASE_PAGE_LIMIT = phase_pages.PAGE_LIMIT


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host in ("localhost", "localhost.localdomain", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LiveBackend(Backend):
    """A server reached over HTTP. Construct, then Session.start() calls start(bus, clock)."""

    kind = "live"

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 3.0,
                 deadline: float = DEFAULT_DEADLINE_S,
                 intervals: tuple[float, float, float] = (METRICS_INTERVAL_S, INFO_INTERVAL_S, PHASES_INTERVAL_S)) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.clock: Clock = SystemClock()
        self._timeout = max(timeout, deadline)       # what one poll can take at most
        self._intervals = intervals
        # One HTTP client per poller thread plus one for control, so a slow endpoint never queues another.
        self._http = {name: HttpClient(self.url, api_key, timeout, deadline)
                      for name in ("metrics", "info", "phases", "control")}
        self._lock = threading.Lock()
        self._raw_info: dict[str, Any] = {}
        self._info: dict[str, Any] = {}
        self._emitted_info_key: Any = None
        self._readback: dict[str, Any] | None = None
        self._readback_lock = threading.Lock()
        self._rank_info: list[dict[str, str]] = []
        self.phase_stream: bool | None = None          # unknown until /specdecode/phases answers
        self.metrics = MetricsDeriver(acceptance=False, phases=False)
        self.latency = LatencyBuckets()       # the latency histograms' bucket deltas (one poller thread)
        self._metrics_missing = False
        self._metrics_retry_at = 0.0
        self.phases = PhaseStreamReader()
        self._bus: Bus | None = None
        self._monitor: ConnectionMonitor | None = None
        self._stop = threading.Event()
        self._restarted = threading.Event()
        self._threads: list[threading.Thread] = []
        self._slow_at_probe: dict[str, str] = {}

    # -- identity and capabilities ----------------------------------------------------------------

    def probe(self, raw: dict[str, Any] | None = None, metrics_text: str | None = None) -> dict[str, Any]:
        """Read /server_info (and /metrics for the rank processes) once, synchronously; raises
        ServerError with one line. `raw`/`metrics_text`: what connect() already read (each read
        can take up to its deadline against a slow server, so none is repeated)."""
        if raw is None:
            raw = self._http["info"].get_json("/server_info")
        if not isinstance(raw, dict):
            raise BadAnswer("GET /server_info: not a JSON object")
        self._take_info(raw)
        try:   # the rank processes (pids, PCI bus ids) are known from the start, for headers and NVML
            if metrics_text is None:
                metrics_text = self.read_metrics_text()
            ranks = rank_info(parse_metrics(metrics_text))
            with self._lock:
                self._rank_info = ranks
        except (ServerSlow, AnswerTooLarge) as e:
            self._slow_at_probe["/metrics"] = str(e)    # said as soon as the session starts
        except (ServerError, MetricsParseError):
            pass
        return raw

    def read_metrics_text(self) -> str:
        """GET /metrics once (bounded like every read); ServerError on failure."""
        return self._http["info"].get_text("/metrics")

    def _take_info(self, raw: dict[str, Any]) -> None:
        info = self.normalize_info(raw)
        with self._lock:
            self._raw_info = raw
            self._info = info

    @abstractmethod
    def normalize_info(self, raw: dict[str, Any]) -> dict[str, Any]:
        """/server_info -> {kind, version, model, tp_size, launch, active, ...} (see EventKind.SERVER_INFO)."""

    @property
    def info(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._info)

    @property
    def raw_info(self) -> dict[str, Any]:
        """The newest /server_info body as the server sent it (doctor judges its launch keys)."""
        with self._lock:
            return dict(self._raw_info)

    @property
    def http(self) -> HttpClient:
        """The control client, for one-off reads beside the pollers (doctor's checks): this
        backend's URL, key and deadlines, never a poller's own client."""
        return self._http["control"]

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._rank_info]

    @property
    def connection(self) -> ConnectionState:
        return self._monitor.state if self._monitor else ConnectionState(False, float("nan"), "not started")

    def local_gpus(self) -> bool:
        """The server runs on this host (so NVML and py-spy here see its GPUs and processes)."""
        me = socket.gethostname()
        ranks = self.rank_info
        if ranks and any(r.get("host") for r in ranks):
            return all(r.get("host") == me for r in ranks if r.get("host"))
        return is_loopback_url(self.url)

    def active_config(self) -> dict[str, Any]:
        """The knobs the server reports active (read-back), {} before the first read."""
        with self._lock:
            return dict(self._info.get("active", {}))

    # -- life cycle -------------------------------------------------------------------------------

    def attach(self, bus: Bus, clock: Clock) -> None:
        """Say where records go and what time it is, without starting threads (tests poll by hand)."""
        self._bus, self.clock = bus, clock
        self._monitor = ConnectionMonitor(bus, clock, self.url, self.kind)
        for endpoint, error in self._slow_at_probe.items():
            self._monitor.slow(endpoint, error)      # an endpoint that was already too slow at connect

    def start(self, bus: Bus, clock: Clock) -> None:
        self.attach(bus, clock)
        self._stop.clear()
        if self._info and self._emitted_info_key is None:
            # What connect() already read: views show the server at once, without waiting a poll.
            self._put(self._info_events(self._now()))
        m, i, p = self._intervals
        for name, fn, every in (("info", self.poll_server_info, i), ("metrics", self.poll_metrics, m),
                                ("phases", self.poll_phases, p)):
            th = threading.Thread(target=self._loop, args=(fn, every), name=f"{self.kind}-{name}", daemon=True)
            self._threads.append(th)
            th.start()

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=self._timeout + 2)
        self._threads.clear()
        for c in self._http.values():
            c.close()

    def _loop(self, fn: Callable[[], bool], every: float) -> None:
        while not self._stop.is_set():
            try:
                keep = fn()
            except Exception as e:   # noqa: BLE001 - a poller must outlive any answer it is given
                keep = True
                if self._monitor is not None:
                    self._monitor.bad_answer(fn.__name__, f"{fn.__name__}: {type(e).__name__}: "
                                                          f"{terminal_safe(str(e))[:120]}")
            if keep is False:            # e.g. the server has no phase stream: stop asking
                return
            # A server that is down is asked less often, but often enough to notice its return.
            self._stop.wait(every if self.connection.connected else max(every, 0.5))

    def _put(self, records: list[Record]) -> None:
        if self._bus is not None and records:
            self._bus.put_many(records)

    def _now(self) -> float:
        return self.clock.now()

    # -- pollers (each runs on its own thread; also callable once, synchronously, in tests) -------

    def _failed(self, endpoint: str, err: Exception) -> None:
        if self._monitor is None:
            return
        if isinstance(err, ServerUnreachable):
            self._monitor.lost(str(err))
            self.metrics.reset()
        elif isinstance(err, (ServerSlow, AnswerTooLarge)):
            # Too slow, or too much, on this endpoint: a poll error there and a degraded connection,
            # not a disconnect.
            self._monitor.slow(endpoint, str(err))
        else:
            self._monitor.ok()          # it answered; what it said is the problem
            self._monitor.bad_answer(endpoint, str(err))

    def metrics_fix(self) -> str | None:
        """What makes a server that answers 404 at /metrics serve it (SGLang: a launch flag), or None."""
        return None

    @property
    def metrics_missing(self) -> bool:
        """/metrics answered 404 on a kind that has a fix for it: nothing of it is shown until it serves."""
        return self._metrics_missing

    def poll_metrics(self) -> bool:
        if self._metrics_missing and self.clock.now() < self._metrics_retry_at:
            return True        # a server without /metrics: ask again now and then, not 4 times a second
        try:
            text = self._http["metrics"].get_text("/metrics")
            now = self._now()
            ms = parse_metrics(text)
        except BadAnswer as e:
            fix = self.metrics_fix() if e.status == 404 else None
            if fix is None:
                self._failed("/metrics", e)
                return True
            self._metrics_missing, self._metrics_retry_at = True, self.clock.now() + METRICS_RETRY_S
            if self._monitor:
                self._monitor.ok()
                self._monitor.bad_answer("/metrics", f"{e}: {fix}")
            return True
        except (ServerError, MetricsParseError) as e:
            self._failed("/metrics", e)
            return True
        self._metrics_missing = False
        if self._monitor:
            self._monitor.ok("/metrics")
        ranks = rank_info(ms)
        if ranks:
            with self._lock:
                self._rank_info = ranks
        self._put(list(self.metrics.update(now, ms, self.active_config())))
        self._put(self.latency.update(now, ms))
        return True

    def poll_server_info(self) -> bool:
        try:
            raw = self._http["info"].get_json("/server_info")
            if not isinstance(raw, dict):
                raise BadAnswer("GET /server_info: not a JSON object")
            now = self._now()
            self._take_info(raw)
        except ServerError as e:
            self._failed("/server_info", e)
            return True
        if self._monitor:
            self._monitor.ok("/server_info")
        self.after_info(now)
        self._put(self._info_events(now))
        return True

    def _info_events(self, now: float) -> list[Record]:
        info = self.info
        out: list[Record] = []
        key = (info.get("startup_time"), info.get("version"), repr(sorted(info.get("launch", {}).items())))
        if key != self._emitted_info_key:
            if self._emitted_info_key is not None:
                # A relaunched server: its counters and phase sequence began again.
                self._restarted.set()
                self.metrics.reset()
            self._emitted_info_key = key
            self._readback = None
            out.append(Event(now, EventKind.SERVER_INFO, {**info, "capabilities": self.capabilities.as_dict()}))
        out += self._readback_events(now, info.get("active", {}))
        return out

    def _readback_events(self, now: float, active: Mapping[str, Any]) -> list[Record]:
        """When the active config read back differs from the last read-back.

        With a phase stream the change point is the stream's first record of the new epoch, so the
        read-back is only a CONFIG_ACTIVE (it updates views while the server idles); without one the
        read-back is the best change point there is.
        """
        active = dict(active)
        with self._readback_lock:            # the info poller and set_config both read back
            prev, self._readback = self._readback, active
        if prev is None or prev == active:
            return []
        if self.phase_stream:
            return [Event(now, EventKind.CONFIG_ACTIVE, {"active": active})]
        return [Event(now, EventKind.CONFIG_CHANGED, {"old": prev, "new": active, "epoch": active.get("config_epoch"),
                                                      "source": "server_info"})]

    def after_info(self, now: float) -> None:
        """Hook for subclasses, run after each good /server_info (e.g. renew a timer lease)."""

    def poll_phases(self) -> bool:
        if self.phase_stream is False:
            return False
        if self._restarted.is_set():
            self._restarted.clear()
            self.phases.reset()
        try:
            # On attaching, the server's backlog is paged through without being reported as current.
            pages, history = phase_pages.read(self._fetch_phases, self.phases.cursor)
            now = self._now()
            for page in pages[:-1]:
                self.phases.update(now, page, history=True)
            samples, events = self.phases.update(now, pages[-1], history=history)
        except BadAnswer as e:
            if e.status == 404:
                self._no_phase_stream()
                return False
            self._failed("/specdecode/phases", e)
            return True
        except (ServerUnreachable, ServerSlow) as e:
            self._failed("/specdecode/phases", e)
            self.phases.reset()
            return True
        except (ValueError, TypeError) as e:
            self._failed("/specdecode/phases", BadAnswer(f"GET /specdecode/phases: {e}"))
            return True
        if self.phase_stream is None:
            self.phase_stream = True
            # The stream gives acceptance and phases per iteration; /metrics keeps rates and gauges.
            self.metrics.acceptance = self.metrics.phases = False
        if self._monitor:
            self._monitor.ok("/specdecode/phases")
        self._put(events + samples)
        return True

    def _fetch_phases(self, after: int) -> Any:
        return self._http["phases"].get_json("/specdecode/phases", {"after": after, "limit": PHASE_PAGE_LIMIT})

    def _no_phase_stream(self) -> None:
        self.phase_stream = False
        self.metrics.acceptance = self.metrics.phases = True

    # -- control ----------------------------------------------------------------------------------

    def wire_changes(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Knob names -> the keys this server kind takes (SGLang's plugin renames steps)."""
        return dict(changes)

    @abstractmethod
    def interpret_reply(self, status: int, body: Any) -> tuple[bool, str]:
        """(applied, reason) from a /set_internal_state reply; the semantics differ per kind."""

    def set_config(self, changes: Mapping[str, Any], by: str = "operator") -> ControlResult:
        changes = dict(changes)
        now = self._now()
        self._put([Event(now, EventKind.CONFIG_REQUESTED, {"changes": changes, "by": by})])

        def refuse(reason: str) -> ControlResult:
            self._put([Event(self._now(), EventKind.CONFIG_REFUSED, {"changes": changes, "reason": reason})])
            return ControlResult(False, changes, reason)

        if not changes:
            return refuse("nothing to change")
        caps = self.capabilities
        known = vocab.args()
        unknown = [k for k in changes if k not in known]
        if unknown:
            return refuse(f"unknown setting {unknown[0]!r} (known: {', '.join(known)})")
        cannot = [caps.why_not_value(k, v) for k, v in changes.items()]
        if any(cannot):
            return refuse("; ".join(r for r in cannot if r))
        try:
            status, body = self._http["control"].post_json("/set_internal_state",
                                                           {"server_args": self.wire_changes(changes)})
        except ServerError as e:
            return refuse(str(e))
        ok, reason = self.interpret_reply(status, body)
        if not ok:
            return refuse(reason)
        active = None
        try:                                      # read back at once so views need not wait a poll
            raw = self._http["control"].get_json("/server_info")
            if isinstance(raw, dict):
                self._take_info(raw)
                active = self.active_config()
                self._put(self._readback_events(self._now(), active))
        except ServerError:
            pass
        self._put([Event(self._now(), EventKind.CONFIG_APPLIED, {"changes": changes, "reply": thaw(body)})])
        return ControlResult(True, changes, "", active)

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...
