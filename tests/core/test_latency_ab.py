"""The A/B of a latency figure over the store (tuner.core.latency_ab): sides as the tok/s A/B's,
requests wholly inside each, a bootstrap over requests, lower is better."""

from __future__ import annotations

import random

from tuner.core.events import EventKind
from tuner.core.latency import RequestTiming
from tuner.core.latency_ab import compare_latency
from tuner.core.records import Event
from tuner.core.store import Store


def _requests(store, t0, t1, gap_s, rng):
    t = t0
    while t + 1.0 < t1:
        gaps = tuple((gap_s * rng.uniform(0.8, 1.2), 1) for _ in range(10))
        r = RequestTiming(t, 0.05, 0.05 + sum(g for g, _ in gaps), 11, gaps)
        store.add(Event(t + r.e2e, EventKind.LOAD_REQUEST, r.to_data()))
        t += 0.5


def test_latency_ab_says_the_itl_fell_with_its_interval():
    rng = random.Random(3)
    st = Store()
    st.add(Event(0.0, EventKind.LOAD_STARTED, {"concurrency": 2}))
    _requests(st, 0.0, 60.0, 0.040, rng)
    st.add(Event(60.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": {}}))
    _requests(st, 60.0, 120.0, 0.025, rng)
    ab = compare_latency(st, 120.0)
    assert ab.status == "ready" and ab.verdict == "better"
    assert 0.5 < ab.lo <= ab.ratio <= ab.hi < 0.8
    assert ab.n_before > 20 and ab.n_after > 20 and "itl_p99 " in ab.text() and "better" in ab.text()
    same = compare_latency(st, 120.0, kind="ttft", q=0.5)
    assert same.verdict == "within noise"


def test_latency_ab_waits_for_requests_and_for_a_change():
    st = Store()
    assert compare_latency(st, 10.0).status == "no change"
    st.add(Event(0.0, EventKind.LOAD_STARTED, {"concurrency": 2}))
    _requests(st, 0.0, 30.0, 0.04, random.Random(1))
    st.add(Event(30.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": {}}))
    _requests(st, 30.0, 33.5, 0.04, random.Random(2))
    ab = compare_latency(st, 33.5)
    assert ab.status == "not yet" and ab.n_before > 5 and ab.n_after < 5
