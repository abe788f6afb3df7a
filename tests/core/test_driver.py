"""The headless driver as a pure unit: the live tuner on a simulated engine behind the real Session
(tests/tuning/sim.py, a manual clock), a scheduled change and trace captures, all through one tick
loop. No server, no sleeps that synchronise: background jobs are waited for on what they did."""

from __future__ import annotations

import threading
from collections import Counter

from harness import wait_until
from probes.names import STEPS
from tests.tuning.sim import make
from tests.tuning.synth import Truth
from tuner.core.driver import Driver, ScheduledChange
from tuner.core.event_text import event_text
from tuner.core.events import EventKind
from tuner.core.records import Event
from tuner.tuning.settings import Setting, settings_space

SPACE = settings_space(5)


def _rig(**driver_kw):
    clock, engine, session, tuner = make(Truth(step=0.6), SPACE, start=Setting(1))
    seen: list[Event] = []
    driver = Driver(session, on_event=seen.append, monotonic=clock.now, **driver_kw)

    def step() -> None:
        clock.advance(0.25)
        engine.run_until(clock.now())
        driver.tick()
    return clock, engine, session, tuner, driver, seen, step


def test_one_tick_loop_runs_a_scheduled_change_a_tuner_and_captures():
    calls: list[int] = []

    def capture(session, num_steps, progress=None):
        calls.append(num_steps)
        if len(calls) == 1:
            raise OSError("the server went away mid-capture")
        session.put(Event(session.now(), EventKind.TRACE_CAPTURED, {"trace_id": f"t{len(calls)}", "files": ["a", "b"]}))
        return "captured"

    clock, engine, session, tuner, driver, seen, step = _rig(
        schedule=[ScheduledChange(200.0, STEPS, 1)], capture_every_s=30.0, capture_steps=2, capture=capture)
    # A tuner started on the driver is stepped by the tick until it has finished (well before 200 s).
    driver.start_tuner(tuner)
    ticks = 0
    while driver.tuner_running():
        step()
        ticks += 1
        assert ticks < 20_000, tuner.status
    # Each capture's time (and its catch-up and settling) is left out of the tuner's A/B: every 30 s
    # leaves it room; every 5 s would leave it none ("A/B had too few tok/s windows").
    assert tuner.result is not None and tuner.state == "done" and tuner.result.best.steps != 1
    assert clock.now() - 1000.0 < 200.0
    # Captures fire on the driver's clock while the tuner runs (the first one fails), and the
    # scheduled change is asked for 200 simulated seconds in, each on its own thread.
    wait_until(lambda: (step(), driver.captures >= 1 and driver.capture_failures == 1)[1], 10, "the captures",
               interval=0.001)
    assert calls[0] == 2 and len(calls) >= 2
    wait_until(lambda: (step(), engine.setting.steps == 1)[1], 10, "the scheduled change", interval=0.001)
    assert clock.now() - 1000.0 >= 200.0
    driver.join(10.0)
    step()

    texts = [event_text(e.kind, e.data) for e in seen]
    kinds = [e.kind for e in seen]
    tuning = [k for k in kinds if k.startswith("tuning_")]
    assert tuning[0] == "tuning_started" and tuning[-1] == "tuning_finished"
    assert "tuning_verified" in tuning
    notes = [t.text for e, t in zip(seen, texts) if e.kind == EventKind.NOTE]
    assert notes[0] == "trace capture failed: the server went away mid-capture"
    assert any(e.kind == EventKind.TRACE_CAPTURED for e in seen)
    assert all(t is not None for e, t in zip(seen, texts) if e.kind.startswith("tuning_"))
    # Each event the store holds reached on_event exactly once.
    key = lambda e: (e.t, e.kind, repr(e.data))
    assert Counter(map(key, seen)) == Counter(map(key, session.store.events()))

    driver.close()
    session.close()


def test_a_released_tuner_puts_the_setting_back_then_is_closed():
    clock, engine, session, tuner, driver, seen, step = _rig()
    driver.start_tuner(tuner)
    while not any(e.kind == "tuning_applied" for e in seen):
        step()
    closed = threading.Event()
    real_close = tuner.close
    tuner.close = lambda: (real_close(), closed.set())     # noqa: E731 - records that it was closed
    assert driver.release_tuner() is True            # it was running: cancelled, still held
    assert driver.tuner is tuner and driver.tuner_released
    ticks = 0
    while driver.tuner is not None:       # it puts the setting back over a few ticks
        step()
        ticks += 1
        assert ticks < 5_000, tuner.status
    assert not driver.tuner_released
    assert closed.wait(10), "the released tuner was never closed"
    assert [e.kind for e in seen if e.kind.startswith("tuning_")][-1] == "tuning_finished"
    assert driver.release_tuner() is False           # nothing held
    session.close()


def test_quitting_ends_a_running_tuner_within_its_bound_and_closes_it():
    clock, engine, session, tuner, driver, seen, step = _rig()
    driver.start_tuner(tuner)
    step()
    closed = threading.Event()
    real_close = tuner.close
    tuner.close = lambda: (real_close(), closed.set())     # noqa: E731 - records that it was closed
    # The simulated engine stands still meanwhile: the bound, not the tuner, ends the wait.
    driver.end_tuner(timeout_s=0.2)
    assert driver.tuner is None and closed.is_set()
    session.close()


def test_run_stops_on_duration_until_or_stop():
    clock, engine, session, tuner, driver, seen, step = _rig()
    stop = threading.Event()
    ticks: list[float] = []
    driver.run(stop, tick_s=0.0, until=lambda: len(ticks) >= 3, on_tick=lambda: ticks.append(clock.now()))
    assert len(ticks) == 3
    stop.set()
    driver.run(stop, tick_s=0.0, on_tick=lambda: ticks.append(clock.now()))
    assert len(ticks) == 3
    session.close()
