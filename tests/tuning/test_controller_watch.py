"""The controller watch headless, over the real backend, Session and Driver against the core's HTTP
stand-in: SGLang with our plugin on an adaptive launch (its records say `adaptive: true`; an older
plugin's carry no such key and the server's adaptive flag decides), and the same server with a
step pinned by the plugin."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

from tests.tuning.synth import Stream, Truth
from tuner.backends import connect
from tuner.core.driver import Driver
from tuner.core.session import Session
from tuner.tuning import controller_check as CC
from tuner.tuning.controller_watch import ControllerWatch
from tuner.tuning.settings import Setting

_spec = importlib.util.spec_from_file_location(
    "core_standin_for_watch", Path(__file__).resolve().parents[1] / "core" / "core_standin.py")
core_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(core_standin)

TRUTH = Truth(verify_n=2.5, step=1.5, off_verify=9.0)


@pytest.fixture
def plugin_adaptive():
    s = core_standin.StandIn(kind="sglang", plugin=True, adaptive=True).start()
    yield s
    s.stop()


def _plugin_records(standin, tiers: list[tuple[int, int]], adaptive_key: bool | None) -> None:
    """Records as the plugin writes them: tiers inside one epoch, each with `adaptive` set to
    adaptive_key (true: the controller chose; false: a pinned tier), or with no such key
    (None) as plugins before it wrote them."""
    stream = Stream(TRUTH, seed=11)
    stream.epoch = standin.config["epoch"]
    for steps, n in tiers:
        for r in stream.records(Setting(steps), n, bs=2, new_epoch=False):
            standin.seq += 1
            r["seq"] = standin.seq
            if adaptive_key is None:
                r.pop("adaptive", None)
            else:
                r["adaptive"] = adaptive_key
            standin.records.append(r)


def _watch(standin, pin: int | None = None, adaptive_key: bool | None = True) -> dict:
    if pin is not None:
        standin.state_extra["specdecode_num_steps"] = pin
    session = Session(connect(standin.url))
    watch = ControllerWatch(session, every_s=0.1)
    driver = Driver(session, watch=watch)
    session.start()
    stop = threading.Event()
    try:
        driver.run(stop, tick_s=0.05, duration_s=60,
                   until=lambda: watch._feed is not None and watch._feed._cursor is not None)
        _plugin_records(standin, [(5, 150), (1, 60), (2, 60)], adaptive_key)
        driver.run(stop, tick_s=0.05, duration_s=30, until=lambda: len(watch._iters) >= 270)
        driver.run(stop, tick_s=0.05, duration_s=2)       # a check after the last record
        events = session.store.events(CC.EVENT_KIND)
    finally:
        driver.close()
        session.close()
    return dict(events[-1].data) if events else {}


@pytest.mark.parametrize("adaptive_key", [True, None], ids=["plugin", "older-plugin"])
def test_the_plugins_records_on_an_adaptive_sglang_are_the_controllers_tiers(plugin_adaptive, adaptive_key):
    doc = _watch(plugin_adaptive, adaptive_key=adaptive_key)
    assert doc.get("source") == "records" and doc["approximate"] is False
    (row,) = doc["rows"]
    assert row["bucket"] == "2" and row["chosen_steps"] == 5 and row["best_steps"] in (1, 2)
    assert row["loss_tok_s"] > 0


@pytest.mark.parametrize("adaptive_key", [False, None], ids=["plugin", "older-plugin"])
def test_a_pinned_step_is_not_the_controllers_choice(plugin_adaptive, adaptive_key):
    assert _watch(plugin_adaptive, pin=3, adaptive_key=adaptive_key) == {}


def test_log_pairs_fed_in_become_a_check_with_the_log_as_source():
    # Managed mode: the SGLang backend's log parser hands (batch size, steps) pairs to the watch.
    session = Session(None)
    watch = ControllerWatch(session, every_s=0.0)
    watch.step()
    assert session.tick() == 0                      # not adaptive, nothing fed: nothing to say
    watch.add_log_pairs([(1, 7)] * 5 + [(12, 3)] * 4 + [(12, 1)])
    watch.step()
    session.tick()
    (e,) = session.store.events(CC.EVENT_KIND)
    assert e.data["source"] == "log" and not e.data["approximate"]
    rows = {r["bucket"]: r for r in e.data["rows"]}
    assert rows["1"]["chosen_steps"] == 7 and rows["8"]["chosen_steps"] == 3
    watch.step()
    session.tick()
    assert len(session.store.events(CC.EVENT_KIND)) == 1     # nothing new, no new check
