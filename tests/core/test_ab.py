"""The A/B comparator: settling, 1-s windows, ratio of medians, bootstrap interval, "not yet"."""

import math

import pytest

from tuner.core import ab, windows
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.core.store import Store


def _feed(store, t0, t1, value, series=S.SERVER_TOK_PER_S, hz=4, wobble=0.0):
    n = int(round((t1 - t0) * hz))
    store.add_many(Sample(t0 + i / hz, series, value + (wobble if i % 2 else -wobble)) for i in range(n))


def _change(store, t, steps):
    store.add_many([Event(t, EventKind.CONFIG_CHANGED, {"old": {}, "new": {"speculative_num_steps": steps},
                                                         "epoch": steps, "source": "phase_stream"})])


def test_no_change_then_not_yet_then_ready():
    st = Store()
    _feed(st, 0.0, 10.0, 100.0, wobble=2.0)
    assert ab.compare_last_change(st, S.SERVER_TOK_PER_S, 10.0).status == ab.NO_CHANGE
    _change(st, 10.0, 3)
    _feed(st, 10.0, 16.0, 120.0, wobble=2.0)
    # 2 s of settling leaves 4 complete windows after the change: not yet.
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 16.0)
    assert r.status == ab.NOT_YET and r.n_after == 4 and r.n_before >= 5
    assert r.text().startswith("not yet")
    _feed(st, 16.0, 20.0, 120.0, wobble=2.0)
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 20.0)
    assert r.ready
    assert r.ratio == pytest.approx(1.2)
    assert r.lo <= r.ratio <= r.hi
    assert r.text().startswith("+20.0 %")


def test_settling_drops_transient():
    st = Store()
    _feed(st, 0.0, 10.0, 100.0)
    _change(st, 10.0, 3)
    _feed(st, 10.0, 12.0, 1000.0)       # the first 2 s after a change are dropped
    _feed(st, 12.0, 20.0, 50.0)
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 20.0)
    assert r.ratio == pytest.approx(0.5) and r.hi == pytest.approx(0.5)


def test_settling_waits_for_twenty_iterations():
    st = Store()
    _feed(st, 0.0, 10.0, 100.0)
    # 2 iterations per second: 20 iterations take 10 s, longer than the 2-s rule.
    st.add_many(Sample(t / 2, S.SERVER_ITERATIONS, float(t)) for t in range(0, 60))
    _change(st, 10.0, 3)
    _feed(st, 10.0, 30.0, 200.0)
    assert ab.settle_end(st, 10.0) == pytest.approx(20.0)
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 30.0)
    assert r.n_after == 10    # the windows [20, 21) ... [29, 30)


def test_before_side_starts_after_previous_change_settles():
    st = Store()
    _feed(st, 0.0, 10.0, 10.0)
    _change(st, 10.0, 2)
    _feed(st, 10.0, 20.0, 100.0)
    _change(st, 20.0, 3)
    _feed(st, 20.0, 30.0, 110.0)
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 30.0)
    assert r.median_before == pytest.approx(100.0) and r.n_before == 8
    assert r.ratio == pytest.approx(1.1)


def test_bootstrap_is_deterministic_and_brackets_the_ratio():
    before = [100 + (i * 37 % 11) for i in range(30)]
    after = [110 + (i * 53 % 13) for i in range(30)]
    one = ab.ratio_of_medians(before, after)
    assert one == ab.ratio_of_medians(list(before), list(after))
    ratio, lo, hi = one
    assert lo < ratio < hi and lo > 1.0


def test_window_means_skip_nan_and_incomplete():
    st = Store()
    st.add_many([Sample(0.0, "x", 1.0), Sample(0.5, "x", 3.0), Sample(1.2, "x", math.nan),
                 Sample(2.1, "x", 5.0), Sample(2.9, "x", 7.0), Sample(3.5, "x", 100.0)])
    assert ab.window_means(st, "x", 0.0, 3.9) == [2.0, 6.0]
    assert ab.window_means(st, "x", 0.0, 0.5) == []


def test_load_stop_ends_the_after_side():
    st = Store()
    _feed(st, 0.0, 10.0, 100.0)
    _change(st, 10.0, 3)
    _feed(st, 10.0, 20.0, 120.0)
    st.add_many([Event(20.0, EventKind.LOAD_STOPPED, {})])
    _feed(st, 20.0, 30.0, 0.0)
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 30.0)
    assert r.ratio == pytest.approx(1.2)


def _event(store, t, kind, **data):
    store.add_many([Event(t, kind, data)])


def test_outage_is_left_out_and_reconnect_settles():
    # The load driver counts 0 tok/s while the server is down: those readings are nobody's setting.
    st = Store()
    _feed(st, 0.0, 10.0, 100.0, series=S.LOAD_TOK_PER_S, wobble=1.0)
    _change(st, 10.0, 3)
    _feed(st, 10.0, 30.0, 120.0, series=S.LOAD_TOK_PER_S, wobble=1.0)
    _event(st, 30.0, EventKind.DISCONNECTED, url="u", since=30.0, error="cannot connect")
    _feed(st, 30.0, 40.0, 0.0, series=S.LOAD_TOK_PER_S)
    # Still away: the after side is the 18 windows before the outage, not the zeros.
    r = ab.compare_last_change(st, S.LOAD_TOK_PER_S, 40.0)
    assert r.ready and r.n_after == 18 and r.ratio == pytest.approx(1.2)
    _event(st, 40.0, EventKind.CONNECTED, url="u", backend="refengine", after_s=10.0)
    _feed(st, 40.0, 42.0, 1000.0, series=S.LOAD_TOK_PER_S)      # cold start: settles like a change
    _feed(st, 42.0, 50.0, 120.0, series=S.LOAD_TOK_PER_S, wobble=1.0)
    r = ab.compare_last_change(st, S.LOAD_TOK_PER_S, 50.0)
    assert r.n_after == 18 + 8
    assert r.ratio == pytest.approx(1.2) and 1.15 < r.lo <= r.hi < 1.25
    assert r.median_after == pytest.approx(120.0, abs=1.0)


def test_outage_before_the_change_is_left_out_of_the_before_side():
    st = Store()
    _feed(st, 0.0, 5.0, 100.0)
    _event(st, 5.0, EventKind.DISCONNECTED, url="u", since=5.0, error="timed out")
    _feed(st, 5.0, 9.0, 0.0)
    _event(st, 9.0, EventKind.CONNECTED, url="u", backend="refengine", after_s=4.0)
    _feed(st, 9.0, 20.0, 100.0)
    _change(st, 20.0, 3)
    _feed(st, 20.0, 30.0, 110.0)
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 30.0)
    # [2, 5) and [11, 20): 3 + 9 windows, none of them from the start's settling (the start of the
    # data settles like a change, as in the report), the outage or the settling after it.
    assert r.n_before == 12 and r.median_before == pytest.approx(100.0)
    assert r.ratio == pytest.approx(1.1)


def test_spans_minus_outages():
    assert windows.spans(0.0, 10.0, [(2.0, 3.0), (5.0, math.inf)]) == [(0.0, 2.0), (3.0, 5.0)]
    assert windows.spans(0.0, 10.0, [(-5.0, 1.0)]) == [(1.0, 10.0)]
    assert windows.spans(0.0, 10.0, []) == [(0.0, 10.0)]


def test_baseline_compares_the_setting_running_now_with_the_baselines_own_run():
    # sharded 100 tok/s (the attach), replicated 80, rank0 150: after the second change "vs previous"
    # is rank0 against replicated, "vs baseline" rank0 against where the operator started.
    st = Store()
    _feed(st, 0.0, 20.0, 100.0, wobble=2.0)
    _change(st, 20.0, 4)
    _feed(st, 20.0, 40.0, 80.0, wobble=2.0)
    _change(st, 40.0, 5)
    _feed(st, 40.0, 60.0, 150.0, wobble=2.0)
    prev = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 60.0)
    base = ab.compare_with_baseline(st, S.SERVER_TOK_PER_S, 60.0, baseline_at=19.999)
    assert prev.ratio == pytest.approx(150 / 80) and base.ratio == pytest.approx(1.5)
    assert base.median_before == pytest.approx(100.0) and base.median_after == pytest.approx(150.0)
    assert ab.run_span(st, 19.999, 60.0) == (st.t_first, 20.0)
    # A baseline pinned inside the run going now: nothing to compare yet.
    assert ab.compare_with_baseline(st, S.SERVER_TOK_PER_S, 60.0, baseline_at=50.0).status == ab.NO_CHANGE
    # A baseline pinned in the middle run compares that run's windows only.
    mid = ab.compare_with_baseline(st, S.SERVER_TOK_PER_S, 60.0, baseline_at=30.0)
    assert mid.ratio == pytest.approx(150 / 80)
