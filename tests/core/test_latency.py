"""Latency percentiles: the server's histograms by bucket deltas (with their bounds) and the load
driver's exact timings (tuner.core.latency), and the bad input each gives one line for."""

from __future__ import annotations

import math

import pytest

from tuner.backends.latency_buckets import LatencyBuckets
from tuner.backends.promtext import parse_metrics
from tuner.core import latency as L
from tuner.core.events import EventKind
from tuner.core.records import Event


def _rows(pairs):
    return [({"le": le, "model_name": "m"}, v) for le, v in pairs]


def test_cumulative_sums_label_sets_and_checks_the_buckets():
    rows = _rows([("0.1", 1), ("0.2", 3), ("+Inf", 4)]) + [({"le": "0.1"}, 2), ({"le": "0.2"}, 2),
                                                         ({"le": "+Inf"}, 2)]
    assert L.cumulative("h", rows) == {0.1: 3, 0.2: 5, math.inf: 6}
    with pytest.raises(L.LatencyError, match="h: no buckets"):
        L.cumulative("h", [])
    with pytest.raises(L.LatencyError, match=r"h: no \+Inf bucket"):
        L.cumulative("h", _rows([("0.1", 1), ("0.2", 3)]))
    with pytest.raises(L.LatencyError, match=r"h: buckets not monotonic \(le=0.1 counts 5, le=0.2 counts 3\)"):
        L.cumulative("h", _rows([("0.1", 5), ("0.2", 3), ("+Inf", 6)]))
    with pytest.raises(L.LatencyError, match="le='fast' is not a number"):
        L.cumulative("h", _rows([("fast", 1), ("+Inf", 1)]))
    with pytest.raises(L.LatencyError, match="without its le label"):
        L.cumulative("h", [({}, 1.0)])
    # several ranks reporting: the lowest only, not TP times over
    ranked = [({"le": "0.1", "tp_rank": r}, 1.0) for r in "01"] + [({"le": "+Inf", "tp_rank": r}, 2.0) for r in "01"]
    assert L.cumulative("q", ranked) == {0.1: 1, math.inf: 2}


def test_bucket_deltas_and_percentiles_show_their_bounds():
    prev = {0.01: 10, 0.04: 20, math.inf: 20}
    cur = {0.01: 10, 0.04: 119, math.inf: 120}
    d = L.delta(cur, prev)
    assert d == {(0.01, 0.04): 99, (0.04, math.inf): 1}
    assert L.delta(prev, cur) is None                    # counts went down: a restarted server
    assert L.delta(cur, None) is None
    assert L.delta({0.1: 1, math.inf: 1}, prev) is None   # other bounds
    bp = L.bucket_percentiles(d)
    assert (bp[0.5].lo, bp[0.5].hi) == (0.01, 0.04) and bp[0.99].text() == "≤ 40 ms"
    assert L.bucket_percentiles({(0.02, 0.04): 1, (0.04, math.inf): 9})[0.5].text() == "> 40 ms"
    assert L.bucket_percentiles({}) == {}
    assert L.buckets_from_data(L.buckets_data(d)) == d
    assert L.buckets_from_data([[0, "x", 1], [0.1], "junk", [0, "0.2", float("nan")], [0.3, "0.2", 1]]) == {}


def test_exact_percentiles_are_numpys_linear_and_itl_is_sglangs():
    assert L.percentile([1, 2, 3, 4], 0.5) == 2.5 and L.percentile([5], 0.99) == 5
    assert math.isnan(L.percentile([], 0.5))
    r = L.RequestTiming(sent=100.0, ttft=0.2, e2e=0.5, tokens=6, gaps=((0.06, 3), (0.02, 1), (0.2, 1)))
    assert r.itl == pytest.approx([0.02, 0.02, 0.02, 0.02, 0.2])   # a 3-token burst's gap over its 3 tokens
    assert L.values_of("gap", [r]) == [0.06, 0.02, 0.2]
    back = L.RequestTiming.from_data(r.to_data())
    assert back == r
    assert L.RequestTiming.from_data({"sent": 1, "ttft": -1, "e2e": 1, "tokens": 1}) is None
    assert L.RequestTiming.from_data({"ttft": 1}) is None
    with pytest.raises(L.LatencyError, match="unknown latency figure"):
        L.values_of("tpot", [r])


def test_window_readout_from_both_sources():
    reqs = [L.RequestTiming(10.0 + i, 0.1 * (i + 1), 1.0, 4, ((0.03, 1), (0.06, 2))) for i in range(5)]
    events = [Event(11.0 + i, EventKind.LOAD_REQUEST, r.to_data()) for i, r in enumerate(reqs)]
    events.append(Event(12.0, EventKind.LATENCY_BUCKETS, {"itl": [[0.035, "0.04", 90], [0.04, "0.06", 10]]}))
    events.append(Event(13.0, EventKind.LATENCY_BUCKETS, {"itl": [[0.04, "0.06", 10]]}))
    r = L.window_readout(events, 10.5, 20.0)
    assert r["requests"] == 4                             # the one sent at 10.0 began before the window
    assert r["driver"]["ttft"]["p50"] == pytest.approx(0.35) and r["driver"]["itl"]["n"] == 12
    assert r["server"]["itl"]["n"] == 110 and r["server"]["itl"]["p50"] == [0.035, 0.04]
    assert r["server"]["itl"]["p99"] == [0.04, 0.06]
    text = "\n".join(L.readout_lines(r))
    assert "p99 ≤ 60 ms" in text and "ITL" in text and "4 requests" in text


def test_a_server_without_latency_metrics_is_one_line(tmp_path):
    lb = LatencyBuckets()
    ms = parse_metrics("sglang:num_running_reqs 1\n")
    got = lb.update(1.0, ms) + lb.update(2.0, ms)
    assert [e.kind for e in got] == [EventKind.LATENCY_UNAVAILABLE]     # said once, not every scrape
    assert "no latency histograms" in got[0].data["reason"] and "--enable-metrics" in got[0].data["reason"]
    r = L.window_readout(got, 0, 3)
    assert r["server"] == {} and "no latency histograms" in "\n".join(L.readout_lines(r))


def test_scrapes_become_bucket_deltas_and_bad_buckets_one_line():
    def body(n_fast, n_slow, bad=False):
        fam = "sglang:inter_token_latency_seconds"
        lines = [f"# TYPE {fam} histogram",
                 f'{fam}_bucket{{le="0.04"}} {n_slow if bad else n_fast}',
                 f'{fam}_bucket{{le="0.06"}} {n_fast + n_slow if not bad else n_fast}',
                 f'{fam}_bucket{{le="+Inf"}} {n_fast + n_slow}',
                 f"{fam}_count {n_fast + n_slow}", f"{fam}_sum 1.0"]
        return parse_metrics("\n".join(lines) + "\n")
    lb = LatencyBuckets()
    assert lb.update(1.0, body(1, 0)) == []             # the first scrape only sets the base
    got = lb.update(2.0, body(5, 2))
    assert len(got) == 1 and got[0].kind == EventKind.LATENCY_BUCKETS
    assert L.buckets_from_data(got[0].data["itl"]) == {(0.0, 0.04): 4, (0.04, 0.06): 2}
    assert lb.update(3.0, body(5, 2)) == []             # nothing moved: no event
    bad = lb.update(4.0, body(5, 9, bad=True))
    assert [e.kind for e in bad] == [EventKind.LATENCY_UNAVAILABLE] and "not monotonic" in bad[0].data["reason"]


def test_bootstrap_ratio_over_requests():
    slow = [L.RequestTiming(0, 0.1, 1, 3, ((0.05, 1), (0.05, 1))) for _ in range(20)]
    fast = [L.RequestTiming(0, 0.1, 1, 3, ((0.025, 1), (0.025, 1))) for _ in range(20)]
    ratio, lo, hi = L.bootstrap_ratio(slow, fast, "itl", 0.99)
    assert ratio == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    assert all(math.isnan(x) for x in L.bootstrap_ratio([], fast, "itl", 0.99))
