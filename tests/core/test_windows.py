"""The one settled-windows rule (tuner.core.windows), and the places its users used to disagree:
a restarted iteration counter, captures in the A/B, the start of the data, load boundaries in the
report, the report's interval whichever setting came first, one parse_duration, one redact."""

from __future__ import annotations

import argparse
import math

import pytest

from tests.report import synthetic
from tuner.core import ab
from tuner.core import series as S
from tuner.core import timeline
from tuner.core import windows as W
from tuner.core.events import EventKind
from tuner.core.records import Event, Sample
from tuner.core.redact import redact
from tuner.core.store import Store
from tuner.recording import Recorder
from tuner.report import load, summarize
from tuner.report.rows import SettingRow
from tuner.report.summary import redact as report_redact
from tuner.report.verdict import compare


# -- settling --------------------------------------------------------------------------------------

def test_settle_end_is_the_later_of_the_time_and_the_iterations():
    counter = [(10.0 + i * 0.5, 100.0 + i * 5) for i in range(20)]      # 10 iterations a second
    assert W.settle_end(10.0, counter, base=100.0) == 12.0               # 20 iterations by 12.0: time rules
    slow = [(10.0 + i, 100.0 + i) for i in range(40)]                    # 1 a second: 20 by 30.0
    assert W.settle_end(10.0, slow, base=100.0) == 30.0
    assert W.settle_end(10.0, slow[:5], base=100.0) == math.inf          # not yet
    assert W.settle_end(10.0) == 12.0                                    # no counter: time alone


def test_a_restarted_counter_counts_again_from_its_new_value():
    # The server restarted at 11: its counter began again. Twenty iterations after the change are
    # 5 before the restart and 15 after it (the report called the drop itself settled, and the A/B
    # waited for the old count + 20, which a restarted server reaches only much later, if ever).
    counter = [(10.5, 1005.0), (11.0, 0.0), (12.0, 5.0), (13.0, 10.0), (14.0, 15.0), (15.0, 20.0)]
    assert W.settle_end(10.0, counter, base=1000.0) == 14.0


def test_no_counter_reading_before_the_change_counts_from_zero():
    assert W.settle_end(0.0, [(1.0, 10.0), (2.5, 25.0)]) == 2.5


def test_window_means_over_plain_readings():
    ts = [0.0, 0.5, 1.2, 2.1, 2.9, 3.5]
    vs = [1.0, 3.0, math.nan, 5.0, 7.0, 100.0]
    assert W.window_means(ts, vs, 0.0, 3.9) == [2.0, 6.0]
    assert W.window_means(ts, vs, 0.0, 3.9, exclude=[(1.0, 2.0)]) == [2.0, 6.0]
    assert W.window_means(ts, vs, 0.0, 0.5) == []


def test_judge_and_enough():
    assert W.judge(1.01, 1.2) == W.BETTER and W.judge(0.8, 0.99) == W.WORSE
    assert W.judge(0.9, 1.1) == W.WITHIN_NOISE
    assert W.enough([1.0] * 5, [1.0] * 5) and not W.enough([1.0] * 5, [1.0] * 4)


def test_gaps_from_transitions():
    moves = [(5.0, False, "refused"), (6.0, False, "again"), (9.0, True, ""), (20.0, False, "gone")]
    assert W.gaps(moves, end=30.0) == [(5.0, 9.0, "refused"), (20.0, 30.0, "gone")]


# -- the A/B over the store --------------------------------------------------------------------------

def _feed(store, t0, t1, value, series=S.SERVER_TOK_PER_S, hz=4):
    store.add_many(Sample(t0 + i / hz, series, value) for i in range(int(round((t1 - t0) * hz))))


def test_a_capture_is_left_out_of_the_ab_and_settles_after():
    # The profiler stalls the server: its 0 tok/s must not count for the setting (the report left
    # captures out; the A/B counted them).
    st = Store()
    _feed(st, 0.0, 10.0, 100.0)
    st.add_many([Event(10.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": {"speculative_num_steps": 3}})])
    _feed(st, 10.0, 20.0, 120.0)
    _feed(st, 20.0, 24.0, 0.0)
    st.add_many([Event(24.0, EventKind.TRACE_CAPTURED, {"trace_id": "x", "seconds": 4.0})])
    _feed(st, 24.0, 26.0, 500.0)                     # the held-back requests: a burst
    _feed(st, 26.0, 28.0, 300.0)                     # settling after it
    _feed(st, 28.0, 40.0, 120.0)
    assert timeline.captures(st) == [(20.0, 26.0, "x")]
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 40.0)
    assert r.ready and r.n_after == 8 + 12 and r.ratio == pytest.approx(1.2) and r.hi == pytest.approx(1.2)


def test_the_start_of_the_data_settles_like_a_change():
    st = Store()
    _feed(st, 0.0, 2.0, 1000.0)                      # a half-warm server just after attaching
    _feed(st, 2.0, 10.0, 100.0)
    st.add_many([Event(10.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": {"speculative_num_steps": 3}})])
    _feed(st, 10.0, 20.0, 100.0)
    r = ab.compare_last_change(st, S.SERVER_TOK_PER_S, 20.0)
    assert r.n_before == 8 and r.median_before == 100.0 and r.hi == pytest.approx(1.0)


# -- the report ------------------------------------------------------------------------------------

def test_the_report_settles_after_a_load_start(tmp_path):
    # Load starts 10 s into the only setting: the first 2 s under load are the settling the A/B
    # drops (its sides restart at a load boundary); the report now drops them too.
    path = tmp_path / "load.db"
    rec = Recorder(path, {"backend": "refengine", "url": "http://127.0.0.1:1", "active": dict(synthetic.A)})
    out = [Event(0.0, "connected", {"url": "u", "backend": "refengine", "after_s": 0}),
           Event(10.0, "load_started", {"concurrency": 2})]
    for i in range(4 * 30):
        t = i / 4
        tok = 0.0 if t < 10 else 1000.0 if t < 12 else 100.0
        out += [Sample(t, S.SERVER_TOK_PER_S, tok), Sample(t, S.LOAD_TOK_PER_S, tok)]
    rec.write(out)
    rec.close()
    s = summarize(load(path))
    row = s.rows[0]
    assert 1000.0 not in row.windows and row.windows.count(100.0) == 17      # [12, 29.75]
    assert [seg.source for seg in s.segments] == ["start", "resumed"]


def test_the_report_interval_is_the_same_whichever_setting_came_first():
    # The bootstrap runs in the order the settings were tried (as the A/B after that change does),
    # and is turned round when the first one is the faster: the report used to bootstrap the
    # runner-up first, which gives another interval from the same windows.
    first = SettingRow((1,), "first", 0, windows=[100.0 + (i * 37 % 11) for i in range(12)])
    second = SettingRow((2,), "second", 1, windows=[90.0 + (i * 53 % 13) for i in range(12)])
    forward = W.ratio_of_medians(first.windows, second.windows)          # second over first
    assert compare(first, second) == forward
    ratio, lo, hi = compare(second, first)                               # first over second
    assert (ratio, lo, hi) == pytest.approx((1 / forward[0], 1 / forward[2], 1 / forward[1]), rel=1e-12)
    assert (ratio, lo, hi) != pytest.approx(W.ratio_of_medians(second.windows, first.windows), rel=1e-9)


# -- parse_duration and redact -------------------------------------------------------------------------

def test_one_parse_duration_for_every_command():
    from tuner.commands import options, record, tune
    from tuner.commands.duration import DurationError, parse_duration

    assert record.parse_duration is tune.parse_duration is parse_duration
    assert parse_duration("1h30m") == 5400 and parse_duration("250ms") == 0.25   # tune refused these
    for bad in ("soon", "0", "1" * 400):                                           # tune took 1e400 as inf
        with pytest.raises(DurationError) as e:
            parse_duration(bad)
        assert isinstance(e.value, ValueError) and isinstance(e.value, argparse.ArgumentTypeError)
    assert "parse_duration" in open(options.__file__).read()      # the TUI's --tune-budget


def test_one_redact_for_the_live_side_and_the_report():
    launch = {"api_key": "K1", "ssl_keyfile": "/etc/k.pem", "hf_token": "K2", "max_total_tokens": 5,
              "num_key_value_heads": 8, "tokenizer_path": "tok", "enable_x": True,
              "launch_command": "serve --admin-api-key K3 --port 1", "argv": ["--api-key", "K4"],
              "nested": {"password": "K5"}}
    red = redact(launch)
    assert report_redact is redact
    assert not any(k in repr(red) for k in ("K1", "K2", "K3", "K4", "K5", "/etc/k.pem"))
    assert red["max_total_tokens"] == 5 and red["num_key_value_heads"] == 8 and red["tokenizer_path"] == "tok"
    assert red["enable_x"] is True and "--port 1" in red["launch_command"]


def test_grouped_windows_keep_the_spread_between_groups():
    # Two sides that ran the same thing, three stretches each; each stretch's windows sit close
    # together but the stretches differ (the host's state lasts seconds). Side b's stretches happened
    # to be the slower ones more often.
    a = [[100.0 + d for d in (-1, 0, 1)] * 5, [80.0 + d for d in (-1, 0, 1)] * 5, [120.0 + d for d in (-1, 0, 1)] * 5]
    b = [[95.0 + d for d in (-1, 0, 1)] * 5, [78.0 + d for d in (-1, 0, 1)] * 5, [90.0 + d for d in (-1, 0, 1)] * 5]
    flat = W.ratio_of_medians([v for g in a for v in g], [v for g in b for v in g])
    grouped = W.ratio_of_medians_clustered(a, b)
    assert grouped[0] == pytest.approx(flat[0])                 # the same point estimate
    # Windows resampled as independent readings call b wholly worse; by stretch it is within noise.
    assert W.judge(*flat[1:]) == W.WORSE
    assert W.judge(*grouped[1:]) == W.WITHIN_NOISE
    assert grouped[1] < flat[1] and grouped[2] > flat[2]
    assert W.ratio_of_medians_clustered(a, b) == grouped           # seeded
    # A real difference far beyond the stretches' spread is still resolved.
    far = [[v * 1.6 for v in g] for g in a]
    assert W.judge(*W.ratio_of_medians_clustered(a, far)[1:]) == W.BETTER
    assert all(math.isnan(x) for x in W.ratio_of_medians_clustered([], b))
    assert all(math.isnan(x) for x in W.ratio_of_medians_clustered([[]], b))


def test_clustered_draws_resample_groups_then_windows():
    one_group = W.clustered_median_draws([[1.0, 2.0, 3.0, 4.0, 5.0]], rounds=400)
    assert len(one_group) == 400 and min(one_group) >= 1.0 and max(one_group) <= 5.0
    assert len(set(one_group)) > 1                               # windows inside a group are resampled
    constant_groups = W.clustered_median_draws([[10.0] * 4, [20.0] * 4], rounds=400)
    assert set(constant_groups) <= {10.0, 15.0, 20.0}            # ... and so are the groups
    assert {10.0, 20.0} <= set(constant_groups)
    assert W.clustered_median_draws([[], []]) == []
    assert all(math.isnan(x) for x in W.percentile_interval([]))
