"""One timeline for live and recorded data: the Store (fed a recording's records, as a replay feeds
it) and the report's RecordingData of the same file answer the Timeline questions alike, so the
spans left out, the settling and the segments the A/B and the report work from are the same."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.report import synthetic
from tuner.core import segments as SEG
from tuner.core import series as S
from tuner.core import timeline as T
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.core.store import Store
from tuner.recording import open_recording
from tuner.report import load

ENGINE_DB = Path(__file__).resolve().parents[1] / "tui" / "fixtures" / "engine.db"


def _both(path: Path) -> tuple[Store, object]:
    store = Store()
    with open_recording(path) as r:
        store.add_many(r.records())
    return store, load(path)


@pytest.fixture(scope="module", params=["engine.db", "synthetic"])
def recorded(request, tmp_path_factory):
    if request.param == "engine.db":
        return _both(ENGINE_DB)
    return _both(synthetic.write(tmp_path_factory.mktemp("tl") / "syn.db"))


def test_store_and_recording_are_one_timeline(recorded):
    store, data = recorded
    assert isinstance(store, T.Timeline) and isinstance(data, T.Timeline)
    assert (store.t_first, store.t_last) == (data.t_first, data.t_last)
    end = data.t_last
    assert T.gaps(store, end) == T.gaps(data, end)
    assert T.captures(store) == T.captures(data)
    assert T.excluded(store) == T.excluded(data)
    assert T.load_cuts(store) == T.load_cuts(data)
    for e in data.events(EventKind.CONFIG_CHANGED):
        assert T.settle_end(store, e.t) == T.settle_end(data, e.t)
        assert T.settle_end(store, e.t, until=e.t + 1) == T.settle_end(data, e.t, until=e.t + 1)
        assert T.last_event(store, EventKind.CONFIG_CHANGED, e.t) == e
    mid = (data.t_first + end) / 2
    for name in (S.SERVER_TOK_PER_S, S.SERVER_ITERATIONS):
        assert store.window(name, mid - 5, mid) == data.window(name, mid - 5, mid)
        assert store.value(name, mid) == data.value(name, mid)
        away = T.excluded(data)
        assert T.window_means(store, name, data.t_first, end, exclude=away) \
            == T.window_means(data, name, data.t_first, end, exclude=away)
    start = data.header.get("active")
    cuts = T.gaps(data, end) + T.captures(data) + T.load_cuts(data)
    assert SEG.segments(store, start, cuts) == SEG.segments(data, start, cuts)


def test_the_fixtures_have_what_the_comparison_needs(recorded):
    # The comparison above means something only where there is something to leave out and a change.
    store, data = recorded
    assert T.excluded(data) and data.events(EventKind.CONFIG_CHANGED)


def test_a_capture_known_only_by_its_event_goes_back_over_the_stall():
    st = Store()
    st.add_many([Sample(float(t), "server/iter_per_s", 0.0 if 14 <= t < 20 else 50.0) for t in range(0, 30)])
    st.add_many([Event(20.0, EventKind.TRACE_CAPTURED, {"trace_id": "c1"})])
    assert T.captures(st) == [(14.0, 22.0, "c1")]


def test_a_gap_not_over_runs_to_the_end_given_and_settles_only_when_over():
    st = Store()
    st.add_many([Sample(float(t), "server/tok_per_s", 1.0) for t in range(10)]
                + [Event(5.0, EventKind.DISCONNECTED, {"since": 4.0, "error": "refused"})])
    assert T.gaps(st, 9.0) == [(4.0, 9.0, "refused")]
    assert T.outages(st) == [(4.0, math.inf)]


def test_segments_cut_at_changes_and_around_gaps_and_a_load_start_only_splits():
    a = {"speculative_num_steps": 3}
    b = {"speculative_num_steps": 5}
    st = Store()
    st.add_many([Sample(float(t), "server/tok_per_s", 1.0) for t in range(0, 41)]
                + [Event(10.0, EventKind.CONFIG_CHANGED, {"old": a, "new": b}),
                   Event(20.0, EventKind.LOAD_STARTED, {})])
    segs = SEG.segments(st, a, [(25.0, 30.0, "away")] + T.load_cuts(st))
    assert [(s.key[0], s.t0, s.t1, s.source) for s in segs] == [
        (3, 0.0, 10.0, SEG.START), (5, 10.0, 20.0, EventKind.CONFIG_CHANGED), (5, 20.0, 25.0, SEG.RESUMED),
        (5, 30.0, 40.0, SEG.RESUMED)]
    assert SEG.setting_label(segs[0].key).startswith("steps=3")
