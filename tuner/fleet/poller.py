"""The fleet poller: one thread per server, each with its own session, never waiting on another.

`FleetPoller(members, key=...)` starts a thread per Member (from any discovery path: command-line
URLs, `--fleet`, `--router`, or Prometheus' targets). Each thread connects (tuner.backends.connect,
bounded), starts the member's session (its pollers), ticks it, and publishes a frozen FleetRow
(tuner.fleet.rows) about four times a second. `rows()` reads the newest rows at once: a server that
hangs holds only its own thread, and its row turns degraded by age (rows.STALE_S) while the others
go on. A server that cannot be reached is `gone` and asked again every RETRY_S; one that answers as
something else (not SGLang, not `serve`) is `refused` with the reason.

`add(member)` polls one more member from then on (a router's worker that registered later,
tuner.fleet.router_watch). `session(name)` hands a member's session to a caller that will tick it itself (the single-server
view): the member's thread stops ticking it until `give_back(name)`. Each thread owns its session
and closes it when the poller closes. `overlays` (tuner.fleet.overlays: Prometheus, the last trace
capture) are started and closed with the poller, and `rows()` lays each over the rows in order.
Must not print or draw.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Sequence

from tuner.core.clock import Clock, SystemClock
from tuner.fleet.members import Member
from tuner.fleet.rows import FleetRow, aged, read_row

TICK_S = 0.25
RETRY_S = 2.0            # a gone server is asked again this often
REFUSED_RETRY_S = 10.0   # a server of another kind, less often
CONNECT_TIMEOUT_S = 1.0  # one socket operation while connecting
JOIN_S = 12.0            # close(): a thread inside connect() ends within its two deadlines

Opener = Callable[[Member], Any]
"""member -> a Session over that member's server (not started); raises ServerError (one line)."""


def member_key(member: Member, key: str | None) -> str | None:
    """The key a member's requests carry: its own key file's, else the command's."""
    if member.api_key_file is None:
        return key
    from probes.api_key import resolve_api_key
    return resolve_api_key(None, str(member.api_key_file), environ={})


def open_member(member: Member, key: str | None = None) -> Any:
    """A Session over the member's server (tuner.backends.connect: kind detected, reads bounded)."""
    from tuner.backends import connect
    from tuner.core.session import Session

    return Session(connect(member.url, api_key=member_key(member, key), timeout=CONNECT_TIMEOUT_S))


class _Slot:
    """One member: its thread's state. Written by that thread only, except `held`."""

    def __init__(self, member: Member) -> None:
        self.member = member
        self.row = FleetRow(member.name, _shown(member.url))
        self.session: Any = None
        self.held = threading.Event()       # the session is ticked by someone else
        self.tried = threading.Event()      # the first connect ended (either way)
        self.thread: threading.Thread | None = None


def _shown(url: str) -> str:
    from tuner.core.redact import redact_url
    return redact_url(url)


class FleetPoller:
    """Threads that keep one FleetRow per member fresh. Start with start(), end with close()."""

    def __init__(self, members: list[Member], *, key: str | None = None, opener: Opener | None = None,
                 clock: Clock | None = None, tick_s: float = TICK_S, retry_s: float = RETRY_S,
                 overlays: Sequence[Any] = ()) -> None:
        self.members = list(members)
        self.overlays = list(overlays)
        self.clock = clock or SystemClock()
        self._opener = opener or (lambda m: open_member(m, key))
        self._tick_s, self._retry_s = tick_s, retry_s
        self._slots = {m.name: _Slot(m) for m in self.members}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = False
        self._started_at = self.clock.now()

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> "FleetPoller":
        # Imported here, once: N threads importing the backends at the same moment would spend the
        # first seconds on the import lock, and a row would age while nothing was asked yet.
        import tuner.backends.refengine  # noqa: F401
        import tuner.backends.sglang  # noqa: F401
        import tuner.core.session  # noqa: F401

        self._started_at = self.clock.now()
        for overlay in self.overlays:
            overlay.start()
        with self._lock:
            self._started = True
            slots = list(self._slots.values())
        for slot in slots:
            self._start_thread(slot, self._started_at)
        return self

    def _start_thread(self, slot: _Slot, now: float) -> None:
        slot.row = replace(slot.row, last_seen=now)   # "connecting" ages from here
        slot.thread = threading.Thread(target=self._run, args=(slot,), name=f"fleet-{slot.member.name}",
                                       daemon=True)
        slot.thread.start()

    def add(self, member: Member) -> None:
        """One more member (a router's new worker), polled from now on; DuplicateName (one line)
        when its name is taken. Any thread may call it."""
        from tuner.fleet.members import DuplicateName

        with self._lock:
            if self._stop.is_set():
                return
            if member.name in self._slots:
                raise DuplicateName(f"fleet: server name {member.name!r} is used twice "
                                    f"({_shown(self._slots[member.name].member.url)} and {_shown(member.url)})")
            slot = self._slots[member.name] = _Slot(member)
            self.members = [*self.members, member]
            started = self._started
        if started:
            self._start_thread(slot, self.clock.now())

    def close(self) -> None:
        """Stop every thread; each closes its own session."""
        self._stop.set()
        with self._lock:
            slots = list(self._slots.values())
        for slot in slots:
            slot.held.clear()
            if slot.thread is not None:
                slot.thread.join(JOIN_S)
        for overlay in self.overlays:
            overlay.close()

    def __enter__(self) -> "FleetPoller":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------------------

    def rows(self) -> list[FleetRow]:
        """The newest row of every member, in member order, aged to now (never blocks on a server)."""
        now = self.clock.now()
        with self._lock:
            rows = [s.row for s in self._slots.values()]
            members = self.members
        rows = [aged(r, now) for r in rows]
        for overlay in self.overlays:
            rows = overlay.fill(rows, members)
        return rows

    def notes(self) -> list[str]:
        """The overlays' problems now (Prometheus down, DCGM series left out), one line each."""
        return [n for o in self.overlays for n in o.notes()]

    def first_tries_done(self) -> bool:
        """Whether every member's first connect has ended, answered or not (`once` waits for it)."""
        with self._lock:
            slots = list(self._slots.values())
        return all(s.tried.is_set() for s in slots)

    def session(self, name: str) -> Any:
        """The member's session for a caller that ticks it itself, or None while it is not connected;
        its thread stops ticking it until give_back(name)."""
        slot = self._slots[name]
        with self._lock:
            if slot.session is None:
                return None
            slot.held.set()
            return slot.session

    def give_back(self, name: str, closed: bool = False) -> None:
        """Tick the member's session again; `closed`: the caller closed it (the single-server view
        closes its session on exit), so the member's thread connects anew."""
        slot = self._slots[name]
        if closed:
            with self._lock:
                slot.session = None
        slot.held.clear()

    def sessions(self) -> dict[str, Any]:
        """The connected members' sessions now (for a setting change: set_config is thread-safe)."""
        with self._lock:
            return {n: s.session for n, s in self._slots.items() if s.session is not None}

    # -- one member's thread -----------------------------------------------------------------------

    def _publish(self, slot: _Slot, row: FleetRow) -> None:
        with self._lock:
            slot.row = row

    def _run(self, slot: _Slot) -> None:
        from tuner.backends.http import BadAnswer, ServerError, ServerSlow

        try:
            while not self._stop.is_set():
                if slot.session is None:
                    try:
                        try:
                            session = self._opener(slot.member)
                        finally:
                            slot.tried.set()
                    except ServerSlow as e:
                        self._publish(slot, replace(slot.row, state="degraded", detail=str(e)))
                        self._stop.wait(self._retry_s)
                        continue
                    except BadAnswer as e:
                        self._publish(slot, replace(slot.row, state="refused", detail=str(e),
                                                    last_seen=self.clock.now()))
                        self._stop.wait(REFUSED_RETRY_S)
                        continue
                    except ServerError as e:      # unreachable, a bad key or URL
                        self._publish(slot, replace(slot.row, state="gone", detail=str(e)))
                        self._stop.wait(self._retry_s)
                        continue
                    session.start()
                    with self._lock:
                        slot.session = session
                    if self._stop.is_set():
                        break
                if not slot.held.is_set():
                    now = self.clock.now()
                    last = now if slot.session.tick() else slot.row.last_seen
                    self._publish(slot, read_row(slot.member.name, slot.row.url, slot.session, now, last))
                self._stop.wait(self._tick_s)
        finally:
            with self._lock:
                session, slot.session = slot.session, None
            if session is not None:
                session.close()
