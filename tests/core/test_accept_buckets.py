"""Acceptance by batch-size and context bucket (probes.accept_buckets) and the series the phase
stream reader derives from it: edges, counts, records without `ctx`, and the round trip from a
recording's (verifies, p_k) readings back to the counts."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from probes import accept_buckets as AB
from tuner.backends.derive import PhaseStreamReader
from tuner.core import series as S


@pytest.mark.parametrize("bs, name", [(1, "bs1"), (2, "bs2"), (3, "bs2"), (7, "bs4"), (8, "bs8"), (31, "bs16"),
                                      (32, "bs32"), (63, "bs32"), (64, "bs64"), (100, "bs64"), (128, "bs128")])
def test_batch_buckets_are_sglang_thresholds_plus_powers_of_two(bs, name):
    assert AB.bucket(AB.BS, bs) == name
    assert set(AB.SGLANG_DEFAULT_THRESHOLDS) <= set(AB.BS_EDGES)


@pytest.mark.parametrize("ctx, name", [(0, "ctx1"), (1, "ctx1"), (255, "ctx1"), (256, "ctx256"), (511, "ctx256"),
                                       (512, "ctx512"), (5000, "ctx4096")])
def test_context_buckets_are_powers_of_two_from_256(ctx, name):
    assert AB.bucket(AB.CTX, ctx) == name


def test_bucket_names_read_back_and_sort():
    assert AB.parse_bucket("bs8") == ("bs", 8) and AB.parse_bucket("ctx256") == ("ctx", 256)
    assert AB.parse_bucket("bs3") is None and AB.parse_bucket("ctx300") is None and AB.parse_bucket("x") is None
    assert AB.bucket_range("bs8") == "batch 8–15" and AB.bucket_range("ctx1") == "context < 256"
    assert AB.bucket_range("bs1") == "batch 1" and AB.bucket_range("ctx256") == "context 256–511"
    assert sorted(["ctx512", "bs16", "ctx1", "bs2"], key=AB.sort_key) == ["bs2", "bs16", "ctx1", "ctx512"]


def test_histograms_by_batch_and_context():
    recs = [{"bs": 1, "accepted": [3], "ctx": [100]},
            {"bs": 2, "accepted": [0, 2], "ctx": [300, 90]},
            {"bs": 2, "accepted": [1, 1]},                      # an older server: no ctx
            {"bs": 2, "accepted": [1, 1], "ctx": [5]},          # misaligned ctx: batch bucket only
            {"bs": "x", "accepted": [1]}, {"bs": 1, "accepted": "no"}]
    h = AB.histograms(recs)
    assert h == {"bs1": [0, 0, 0, 1], "bs2": [1, 4, 1], "ctx1": [0, 0, 1, 1], "ctx256": [1]}
    acc = AB.position_acceptance(h["bs2"], 3)
    assert acc.verifies == 6 and acc.p == pytest.approx((5 / 6, 1 / 6, 0.0))
    assert acc.alpha == pytest.approx((5 / 6, 1 / 5, 0.0)) and acc.tau == pytest.approx(1 + 1.0)


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=9))
def test_counts_come_back_from_verifies_and_positions(h):
    if sum(h) == 0:
        return
    steps = len(h) - 1
    acc = AB.position_acceptance(h, steps)
    assert AB.histogram_from_positions(float(acc.verifies), acc.p) == h


def test_positions_that_are_not_counts_give_nothing():
    assert AB.histogram_from_positions(float("nan"), [0.5]) is None
    assert AB.histogram_from_positions(10.0, [0.5, 0.8]) is None      # p rose: not a histogram
    assert AB.histogram_from_positions(10.0, [float("nan")]) is None


def test_the_phase_stream_reader_writes_bucket_series():
    def rec(seq, acc, ctx=None):
        r = {"seq": seq, "t": 10.0 + seq, "epoch": 1, "steps": 2, "topk": 1, "num_draft_tokens": 3,
             "placement": "sharded", "bs": len(acc), "wall_ms": 5.0, "phase_ms": {"verify": 4.0}, "accepted": acc}
        if ctx is not None:
            r["ctx"] = ctx
        return r

    r = PhaseStreamReader()
    r.update(0.0, {"next": 0, "dropped": 0, "records": []})
    s, _ = r.update(1.0, {"next": 3, "dropped": 0, "records": [rec(1, [2], [10]), rec(2, [0, 1], [300, 20]),
                                                                rec(3, [1, 1])]})
    got = {x.series: x.value for x in s}
    assert got[S.bucket_verifies("bs1")] == 1 and got[S.bucket_accept_pos("bs1", 2)] == 1.0
    assert got[S.bucket_verifies("bs2")] == 4 and got[S.bucket_accept_pos("bs2", 1)] == pytest.approx(3 / 4)
    assert got[S.bucket_verifies("ctx1")] == 2 and got[S.bucket_accept_pos("ctx1", 1)] == 1.0
    assert got[S.bucket_verifies("ctx256")] == 1 and got[S.bucket_accept_pos("ctx256", 1)] == 0.0
    # The unbucketed readings are the whole page, old records included.
    assert got[S.SPEC_VERIFIES] == 5
