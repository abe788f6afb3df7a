"""The backend contract: what every server kind (our engine, SGLang, a recording) offers the session.

A backend declares what it can do (Capabilities, Harlequin-style flags), starts producers that put
records on the bus, and carries control requests to its server. Views decide what to show from the
flags alone and never ask "which server is this". Backends must not touch the store or any widget.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from tuner.core import setting as vocab
from tuner.core.bus import Bus
from tuner.core.clock import Clock
from tuner.core.events import EventKind
from tuner.core.records import Event

# The knobs, named as the server args they set (the control protocol is SGLang's: docs/protocol.md).
from probes.names import DRAFT_TOKENS, KNOBS, PLACEMENT, PLACEMENTS, STEPS, TOPK  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do right now. Field names are the design note's capability flags.

    `reasons` maps a knob (server-arg name) the backend cannot set live to a sentence people can
    read, saying why and what would work instead (e.g. a relaunch).
    """

    settable: frozenset[str] = frozenset()   # the knobs (server-arg names) it can change live
    CAN_CAPTURE_TRACE: bool = False
    CAN_FETCH_TRACE: bool = False      # trace files can be downloaded over HTTP (server on another host)
    HAS_PHASE_TIMERS: bool = False     # per-phase ms per iteration are measured live
    HAS_PHASE_STREAM: bool = False     # GET /specdecode/phases exists
    LOCAL_GPUS: bool = False           # the server's GPUs are on this host (NVML and py-spy see them)
    READ_ONLY: bool = False            # a recording: nothing can be changed
    reasons: Mapping[str, str] = field(default_factory=dict)
    restart_keys: frozenset[str] = frozenset()   # knobs a managed relaunch could change
    # A knob settable live at some values only (SGLang: the step tiers the plugin can pin): those
    # values, notes on values that hold partly ("bs 1-7"), and the reason for any other value.
    live_values: Mapping[str, tuple] = field(default_factory=dict)
    value_notes: Mapping[str, Mapping[Any, str]] = field(default_factory=dict)
    value_refusal: Callable[[str, Any], str] | None = field(default=None, compare=False)
    # What the server lacks that views would otherwise show empty, each "what: the fix", and what
    # still works without it (the TUI's notice panel; `once` prints them).
    missing: tuple[str, ...] = ()
    still_works: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "reasons", MappingProxyType(dict(self.reasons)))
        object.__setattr__(self, "live_values", MappingProxyType(dict(self.live_values)))
        object.__setattr__(self, "value_notes", MappingProxyType({k: MappingProxyType(dict(v))
                                                                  for k, v in self.value_notes.items()}))

    def can_set(self, key: str) -> bool:
        """Whether `key` (a server-arg name of a knob-table row) can be changed live here."""
        k = vocab.knob(key)
        return k is not None and k.arg == key and key in self.settable and not self.READ_ONLY

    def why_not(self, key: str) -> str | None:
        """None when `key` can be changed live, else the reason to show in place of the control."""
        if self.can_set(key):
            return None
        if self.READ_ONLY:
            return "a recording cannot be changed"
        return self.reasons.get(key, f"this server cannot change {key} live")

    def why_not_value(self, key: str, value: Any) -> str | None:
        """None when `key` can be set to `value` live, else the reason (and what would work)."""
        reason = self.why_not(key)
        if reason is not None:
            return reason
        allowed = self.live_values.get(key)
        if allowed is None or value in allowed:
            return None
        if self.value_refusal is not None:
            return self.value_refusal(key, value)
        return f"{vocab.word(key)} {value} is not settable live here (these are: {', '.join(map(str, allowed))})"

    def allowed_values(self, key: str) -> tuple | None:
        """The only values `key` takes live, when the server restricts them (None: its bounds)."""
        return self.live_values.get(key)

    def needs_restart_for(self, key: str) -> str | None:
        """The reason when only a relaunch of the server can change `key`, else None."""
        if key in self.restart_keys and not self.can_set(key):
            return self.reasons.get(key, f"changing {key} needs a relaunch of the server")
        return None

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k.isupper()}
        d["settable"] = sorted(self.settable)
        d["reasons"] = dict(self.reasons)
        d["restart_keys"] = sorted(self.restart_keys)
        if self.missing:
            d["missing"], d["still_works"] = list(self.missing), self.still_works
        if self.live_values:
            d["live_values"] = {k: list(v) for k, v in self.live_values.items()}
            d["value_notes"] = {k: {str(x): t for x, t in v.items()} for k, v in self.value_notes.items()}
        return d


@dataclass(frozen=True)
class ControlResult:
    """The answer to one set_config call.

    ok: the server applied every change. reason: one line when not ok (the server's message, the
    backend's refusal, or the transport error). active: the server's active config after the call
    when the server said it (our engine does), else None.
    """

    ok: bool
    changes: Mapping[str, Any]
    reason: str = ""
    active: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ConnectionState:
    """connecting (since NaN), connected, degraded (connected, with `degraded` the reason) or
    disconnected (`error` the reason)."""

    connected: bool
    since: float
    error: str = ""
    degraded: str = ""


class ConnectionMonitor:
    """Turns poll outcomes from several threads into connection events, once per change.

    connected -> degraded when an endpoint answers too slowly (DEGRADED, and a POLL_ERROR on that
    endpoint); degraded -> connected when every slow endpoint answered in time again (CONNECTED with
    after_s 0); anything -> disconnected when nothing answers at all (DISCONNECTED).
    """

    def __init__(self, bus: Bus, clock: Clock, url: str, backend: str) -> None:
        self._bus, self._clock, self._url, self._backend = bus, clock, url, backend
        self._lock = threading.Lock()
        self._state: ConnectionState | None = None
        self._errors: dict[str, str] = {}
        self._slow: dict[str, str] = {}

    @property
    def state(self) -> ConnectionState:
        with self._lock:
            return self._state or ConnectionState(False, math.nan, "connecting")

    def ok(self, endpoint: str | None = None) -> bool:
        """Record a good answer in time; returns True when this ends a disconnection (or is the first)."""
        events: list[Event] = []
        with self._lock:
            if endpoint is not None:
                self._errors.pop(endpoint, None)
                self._slow.pop(endpoint, None)
            st = self._state
            now = self._clock.now()
            first = st is None or not st.connected
            if first:
                after = 0.0 if st is None else max(0.0, now - st.since)
                self._state = ConnectionState(True, now)
                events.append(Event(now, EventKind.CONNECTED, {"url": self._url, "backend": self._backend,
                                                               "after_s": round(after, 3)}))
                events += self._degrade_locked(now)      # still slow elsewhere
            elif st.degraded and not self._slow:
                self._state = ConnectionState(True, now)
                events.append(Event(now, EventKind.CONNECTED, {"url": self._url, "backend": self._backend,
                                                               "after_s": 0.0, "was": "degraded"}))
            elif st.degraded:
                events += self._degrade_locked(now)      # the reason shown must still be true
        self._bus.put_many(events)
        return first

    def _degrade_locked(self, now: float) -> list[Event]:
        st = self._state
        if not self._slow or st is None or not st.connected:
            return []
        endpoint, reason = next(iter(self._slow.items()))
        if st.degraded == reason:
            return []
        self._state = ConnectionState(True, now, degraded=reason)
        return [Event(now, EventKind.DEGRADED, {"url": self._url, "since": now, "endpoint": endpoint,
                                                "reason": reason})]

    def slow(self, endpoint: str, error: str) -> None:
        """The server took the request but did not answer in full in time: degraded, not gone."""
        self.bad_answer(endpoint, error)
        with self._lock:
            self._slow[endpoint] = error
            now = self._clock.now()
            if self._state is None:        # slow from the first poll on: it did answer connect()
                self._state = ConnectionState(True, now)
            events = [] if self._state.degraded else self._degrade_locked(now)
        self._bus.put_many(events)

    def lost(self, error: str) -> None:
        """The server did not answer at all (refused, reset, connect timed out)."""
        with self._lock:
            self._slow.clear()
            st = self._state
            if st is not None and not st.connected:
                return
            now = self._clock.now()
            self._state = ConnectionState(False, now, error)
        self._bus.put(Event(now, EventKind.DISCONNECTED, {"url": self._url, "since": now, "error": error}))

    def bad_answer(self, endpoint: str, error: str) -> None:
        """The server answered with something unusable; said once per distinct error per endpoint."""
        with self._lock:
            if self._errors.get(endpoint) == error:
                return
            self._errors[endpoint] = error
        self._bus.put(Event(self._clock.now(), EventKind.POLL_ERROR, {"endpoint": endpoint, "error": error}))


class Backend(ABC):
    """One server kind. Subclasses set `kind` and implement the abstract methods.

    Attributes:
        kind: "refengine", "sglang" or "replay".
        url: the server's base URL ("" for a recording).
        api_key: sent as `Authorization: Bearer` when set.
    """

    kind: str = "?"
    url: str = ""
    api_key: str | None = None
    can_seek: bool = False
    """Whether `seek` can show another moment (a recording); a live server has only now."""

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What can be done now (may change, e.g. when SGLang is relaunched with our plugin)."""

    @property
    def info(self) -> dict[str, Any]:
        """The server's identity as last read (version, model, tp_size, launch args, active config)."""
        return {}

    @property
    def connection(self) -> ConnectionState:
        return ConnectionState(True, math.nan)

    @abstractmethod
    def start(self, bus: Bus, clock: Clock) -> None:
        """Start producing records onto `bus` (background threads for live servers)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every thread this backend started and release its connections."""

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        """One dict per TP rank (tp_rank, pid, pci_bus_id, host) when the server says, else []."""
        return []

    def why_not(self, key: str) -> str | None:
        """capabilities.why_not(key): None when `key` can change live, else the reason to show.
        At TP size 1 a draft placement is not a choice: every placement is the same computation."""
        if key == PLACEMENT and self.info.get("tp_size") == 1 and self.capabilities.can_set(key):
            return TP1_PLACEMENT
        return self.capabilities.why_not(key)

    def needs_restart_for(self, key: str) -> str | None:
        """capabilities.needs_restart_for(key)."""
        return self.capabilities.needs_restart_for(key)

    def pump(self) -> int:
        """Produce what is due on the caller's thread; returns how many records. The session's tick
        calls it before draining the bus. A live backend produces on its own threads: nothing here."""
        return 0

    def seek(self, t: float) -> None:
        """Put the records up to time `t` on the bus again (the caller cleared the store first).
        Only a backend with `can_seek` can; a live server has only now."""
        raise RuntimeError("this backend cannot seek")

    def set_config(self, changes: Mapping[str, Any], by: str = "operator") -> ControlResult:
        """Ask for a new active configuration (blocking; never call it from a UI thread).

        Puts CONFIG_REQUESTED then CONFIG_APPLIED or CONFIG_REFUSED on the bus. The change point for
        comparisons is the CONFIG_CHANGED event, which comes from what the server reports running.
        """
        return ControlResult(False, dict(changes), "a recording cannot be changed")


TP1_PLACEMENT = ("TP size 1: every draft placement is the same computation (target and draft share one GPU), "
                 "so there is nothing to move")


def _flag(name: str) -> property:
    return property(lambda self: getattr(self.capabilities, name), doc=f"capabilities.{name}")


# Harlequin-style flags readable on the backend itself (backend.READ_ONLY), as views expect.
for _name in [f for f in Capabilities.__dataclass_fields__ if f.isupper()]:
    setattr(Backend, _name, _flag(_name))

