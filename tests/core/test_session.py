"""Session: producers on other threads, one drain on the caller's thread, views over the store."""

import math
import threading

from tuner.core import series as S
from tuner.core.clock import ManualClock
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.core.session import Session


def test_tick_drains_every_producer_in_order():
    s = Session(clock=ManualClock(100.0))
    n = 500

    def produce(name):
        for i in range(n):
            s.put(Sample(float(i), name, float(i)))

    threads = [threading.Thread(target=produce, args=(f"p{k}/x",)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    r0 = s.store.revision
    assert s.tick() == 4 * n
    assert s.store.revision == r0 + 1
    for k in range(4):
        assert s.store.window(f"p{k}/x").v == tuple(float(i) for i in range(n))
    assert s.tick() == 0 and s.store.revision == r0 + 1


def test_tick_limit_and_recorder_sees_the_same_records():
    seen = []

    class Sink:
        def write(self, records):
            seen.extend(records)

        def close(self):
            seen.append("closed")

    s = Session(clock=ManualClock(0.0), recorder=Sink())
    recs = [Sample(float(i), "x", 1.0) for i in range(10)]
    for r in recs:
        s.put(r)
    assert s.tick(limit=3) == 3
    assert s.tick() == 7
    s.close()
    assert seen[:-1] == recs and seen[-1] == "closed"


def test_views_connection_config_and_notes():
    clock = ManualClock(5.0)
    s = Session(clock=clock)
    assert s.connection().text() == "connecting"
    s.put(Event(1.0, EventKind.SERVER_INFO, {"kind": "refengine", "active": {"speculative_num_steps": 3}}))
    s.put(Event(1.0, EventKind.CONNECTED, {"url": "http://127.0.0.1:1", "after_s": 0}))
    s.tick()
    assert s.connection().connected
    assert s.active_config() == {"speculative_num_steps": 3}
    assert s.server_info()["kind"] == "refengine"
    s.put(Event(2.0, EventKind.CONFIG_CHANGED, {"old": {"speculative_num_steps": 3},
                                                "new": {"speculative_num_steps": 2}}))
    s.put(Event(3.0, EventKind.DISCONNECTED, {"since": 3.0, "error": "connection refused"}))
    s.note("hello")
    s.tick()
    assert s.active_config() == {"speculative_num_steps": 2}
    c = s.connection()
    assert not c.connected and c.since == 3.0 and "refused" in c.text()
    assert s.store.last_event(EventKind.NOTE).t == 5.0


def test_throughput_series_follows_the_load_driver():
    s = Session(clock=ManualClock(0.0))
    assert s.throughput_series() == S.SERVER_TOK_PER_S
    s.put(Event(1.0, EventKind.LOAD_STARTED, {"concurrency": 4}))
    s.tick()
    assert s.throughput_series() == S.LOAD_TOK_PER_S
    s.put(Event(2.0, EventKind.LOAD_STOPPED, {}))
    s.tick()
    assert s.throughput_series() == S.SERVER_TOK_PER_S
    assert s.ab().status == "no change"
    assert math.isnan(s.store.value(S.SERVER_TOK_PER_S))
