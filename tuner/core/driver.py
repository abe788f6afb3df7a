"""The one headless driver: the tick every face runs, and the jobs that ride on it.

A face (the TUI, `record`, `tune`, `once`) builds a Session, hands it to a Driver and calls
`tick()` on its own clock (Textual's timer) or lets `run()` loop. One tick does, in this order:
start the scheduled changes that are due, start a due trace capture, step the live tuner (its
decisions become events on the bus before the session drains it) and the watch (the server's own
adaptive controller checked, tuner.tuning.controller_watch), move the bus into the store
and the recorder, and pass every event added since the last tick to `on_event` once.

Blocking work (a setting change, a capture, closing a tuner, whose phase feed joins a thread) runs
on daemon threads, at most one of each at a time: a stop never waits for a server that will not
answer. A failed background job becomes a `note` event, so the store, a recording and every
face's event text see it.

Must not import textual, print, or word an event (tuner.core.event_text does); must not decide
anything about tuning (tuner.tuning owns the algorithm; this only starts, steps, cancels and
closes a tuner).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from tuner.core.records import Event

CAPTURE_STEPS = 5
END_TUNER_S = 10.0
"""Quitting while tuning: how long the tuner may take to put the server back before it is closed."""


@dataclass(frozen=True, order=True)
class ScheduledChange:
    """`--set-at 20:speculative_num_steps=4`: ask for a change this many seconds after the start."""

    at_s: float
    key: str = field(compare=False)
    value: Any = field(compare=False)


class Watch(Protocol):
    """A watcher stepped on every tick whose findings are events (tuner.tuning.controller_watch)."""

    def step(self) -> None: ...
    def close(self) -> None: ...


class LiveTuner(Protocol):
    """What the driver needs of a tuner (tuner.tuning.live.Tuner)."""

    state: str

    def start(self) -> None: ...
    def step(self) -> bool: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...


Capture = Callable[..., Any]
"""capture(session, num_steps=..., progress=...) -> Captured; tuner.core.capture.capture_into."""


class Background:
    """At most one blocking job of a kind at a time, on a daemon thread off the ticking one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self, fn: Callable[[], None]) -> bool:
        """Start `fn`; False (and nothing started) while the last one still runs."""
        if self.busy:
            return False
        self._thread = threading.Thread(target=fn, name=self.name, daemon=True)
        self._thread.start()
        return True

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


def first_line(e: BaseException) -> str:
    """One line for a failed job: the message alone for the errors that carry a sentence."""
    from probes.capture import CaptureError

    text = (str(e).splitlines() or [""])[0]
    if isinstance(e, (CaptureError, OSError)) and text:
        return text
    return f"{type(e).__name__}: {text[:200]}"


class Driver:
    """The tick, the tuner's lifecycle, scheduled changes and background captures over one Session.

    Args:
        session: the Session (started by the caller).
        schedule: setting changes to request, by seconds after `begin()` (the first tick).
        capture_every_s: capture a trace this often (None: only when asked); the first one interval
            after the start.
        capture_steps: decode iterations per scheduled capture.
        on_event: called on the ticking thread with each event new to the store, once, oldest first.
        capture: the capture function (tuner.core.capture.capture_into by default).
        monotonic: the clock schedules and captures are timed by.
        watch: stepped on every tick before the session drains (its events land in the same tick),
            closed by close(); a failing step becomes one note and the watch is dropped.
    """

    def __init__(self, session: Any, *, schedule: Sequence[ScheduledChange] = (),
                 capture_every_s: float | None = None, capture_steps: int = CAPTURE_STEPS,
                 on_event: Callable[[Event], None] | None = None, capture: Capture | None = None,
                 monotonic: Callable[[], float] = time.monotonic, watch: Watch | None = None) -> None:
        self.session = session
        self.watch = watch
        self.schedule = sorted(schedule)
        self.capture_every_s = capture_every_s
        self.capture_steps = capture_steps
        self.on_event = on_event
        self._capture_fn = capture
        self._monotonic = monotonic
        self.t0: float | None = None
        self._next_capture = math.inf
        self._todo: list[ScheduledChange] = []
        self._changes = Background("driver-set")
        self._captures = Background("driver-capture")
        self._closing = Background("driver-tuner-close")
        self._seen = session.store.events_added
        self.moved = 0
        self.captures = 0
        self.capture_failures = 0
        self.tuner: LiveTuner | None = None
        self._stepping = False
        self.tuner_released = False
        """True while a cancelled tuner (its face gone) puts the server back; the tick closes it after."""

    # -- the tick ---------------------------------------------------------------------------------

    def begin(self) -> None:
        """Start the schedule's clock (the first tick does it when the face has not)."""
        if self.t0 is None:
            self.t0 = self._monotonic()
            self._todo = list(self.schedule)
            self._next_capture = self.t0 + self.capture_every_s if self.capture_every_s else math.inf

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else self._monotonic() - self.t0

    def tick(self) -> int:
        """One round: due jobs, the tuner, the bus into the store; returns the records moved."""
        self.begin()
        now = self._monotonic()
        while self._todo and now - self.t0 >= self._todo[0].at_s and not self._changes.busy:
            self.change(self._todo.pop(0))
        if now >= self._next_capture and not self._captures.busy:
            self.capture(self.capture_steps)
            self._next_capture = now + (self.capture_every_s or math.inf)
        tuner = self.tuner
        if tuner is not None:
            # The tuner's decisions become events on the bus: step it before the session drains.
            running = self._stepping = tuner.step()
            if not running and self.tuner_released:
                self.tuner, self.tuner_released = None, False
                self._close_later(tuner)
        if self.watch is not None:
            try:
                self.watch.step()
            except Exception as e:   # noqa: BLE001 - a watcher must never end the session
                self.session.note(f"controller check stopped: {first_line(e)}")
                watch, self.watch = self.watch, None
                self._closing.run(watch.close)    # its feed thread joins: not on the ticking thread
        moved = self.session.tick()
        self.moved += moved
        self._follow()
        return moved

    def _follow(self) -> None:
        store = self.session.store
        if self.on_event is None:     # nobody listens (the TUI reads the store itself)
            self._seen = store.events_added
            return
        new = store.events_since(self._seen)
        self._seen = store.events_added
        for e in new:
            self.on_event(e)

    def skip_events(self) -> None:
        """Forget the events the store holds now (a replay seeked: the face redraws from the store)."""
        self._seen = self.session.store.events_added

    def run(self, stop: threading.Event, *, tick_s: float = 0.1, duration_s: float | None = None,
            until: Callable[[], bool] | None = None, on_tick: Callable[[], None] | None = None) -> None:
        """Tick every `tick_s` until `stop` is set, `duration_s` (from this call) has passed or
        `until()` is true after a tick.

        `on_tick` runs after each tick (a progress line). The background jobs get a bounded wait at
        the end and one last tick takes what they left on the bus.
        """
        self.begin()
        end = math.inf if duration_s is None else self._monotonic() + duration_s
        while not stop.is_set():
            started = self._monotonic()
            if started >= end:
                break
            self.tick()
            if on_tick is not None:
                on_tick()
            if until is not None and until():
                break
            stop.wait(max(0.0, tick_s - (self._monotonic() - started)))
        self.join(5.0)
        self.tick()

    def join(self, timeout: float) -> None:
        """Wait (bounded) for the running change and capture jobs."""
        self._captures.join(timeout)
        self._changes.join(timeout)

    # -- scheduled changes and captures ------------------------------------------------------------

    @property
    def busy_capturing(self) -> bool:
        return self._captures.busy

    def change(self, change: ScheduledChange, by: str = "record") -> bool:
        """Ask for one change in the background; the backend's events say how it went, a failure
        to ask at all becomes a note."""
        def job() -> None:
            try:
                self.session.set_config({change.key: change.value}, by=by)
            except Exception as e:   # noqa: BLE001 - a failed change is reported, the session goes on
                self.session.note(f"set {change.key}={change.value} failed: {first_line(e)}")
        return self._changes.run(job)

    def capture(self, num_steps: int = CAPTURE_STEPS, progress: Callable[[str, float | None], None] | None = None,
                done: Callable[[Any, str], None] | None = None) -> bool:
        """Capture a trace on every rank in the background (False while one runs).

        `progress(text, fraction)` is called from the capture's thread; `done(captured, error)` once
        at the end, with `captured` None and a one-line error when it failed (also noted as an event).
        """
        def job() -> None:
            capture = self._capture_fn
            if capture is None:
                from tuner.core.capture import capture_into as capture
            try:
                captured = capture(self.session, num_steps=num_steps, progress=progress)
            except Exception as e:   # noqa: BLE001 - a bad trace or server must never end the session
                msg = first_line(e)
                self.capture_failures += 1
                self.session.note(f"trace capture failed: {msg}")
                if done is not None:
                    done(None, msg)
                return
            self.captures += 1
            if done is not None:
                done(captured, "")
        return self._captures.run(job)

    # -- the tuner's lifecycle ---------------------------------------------------------------------

    def start_tuner(self, tuner: LiveTuner) -> None:
        """Start a tuner; the tick steps it from now on."""
        if self.tuner is not None:
            raise RuntimeError("a tuner is already running")
        tuner.start()
        self.tuner, self.tuner_released, self._stepping = tuner, False, True

    def tuner_running(self) -> bool:
        """A tuner is held and its last step said tuning goes on (True until the first tick)."""
        return self.tuner is not None and self._stepping

    def cancel_tuner(self) -> None:
        """Stop tuning; the tuner puts the best verified setting back over the next ticks."""
        if self.tuner is not None:
            self.tuner.cancel()

    def release_tuner(self) -> bool:
        """The face lets go of the tuner: a running one is cancelled (it puts the best verified setting
        back, stepped by the tick, and is closed once done); a finished one is closed now (in the
        background). True when it was still running."""
        tuner = self.tuner
        if tuner is None:
            return False
        if tuner.state == "running":
            tuner.cancel()
            self.tuner_released = True
            return True
        self.tuner, self.tuner_released = None, False
        self._close_later(tuner)
        return False

    def end_tuner(self, timeout_s: float = END_TUNER_S) -> None:
        """Quitting while tuning: let the tuner put the server back (bounded), then close it here."""
        tuner, self.tuner, self.tuner_released = self.tuner, None, False
        if tuner is None:
            return
        try:
            tuner.cancel()
            # Wall time, whatever clock the schedule runs on: this bounds how long a quit may take.
            end = time.monotonic() + timeout_s
            pause = threading.Event()
            while tuner.step() and time.monotonic() < end:
                pause.wait(0.05)
        finally:
            tuner.close()

    def _close_later(self, tuner: LiveTuner) -> None:
        # Closing joins the tuner's phase-feed thread: never on the ticking (UI) thread.
        if not self._closing.run(tuner.close):
            self._closing.join(10.0)
            self._closing.run(tuner.close)

    def close_watch(self) -> None:
        """Close the watch (its feed thread joins: not on a UI tick)."""
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.close()

    def close(self, timeout_s: float = END_TUNER_S) -> None:
        """End a tuner still held (bounded), close the watch and wait (bounded) for the background jobs."""
        self.close_watch()
        self.end_tuner(timeout_s)
        self.join(5.0)
        self._closing.join(timeout_s)
