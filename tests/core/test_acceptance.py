"""Acceptance maths checked against the definitions in tuner/core/acceptance.py's docstring
(docs/ARCHITECTURE.md "Names and contracts"), with hypothesis."""

import math

import pytest
from hypothesis import given, strategies as st

from tuner.core import acceptance as A

hists = st.lists(st.integers(0, 10_000), min_size=1, max_size=12).filter(lambda h: sum(h) > 0)


def test_worked_example():
    # 10 verify rounds: 2 accepted nothing, 3 accepted 1 draft, 5 accepted 2 drafts.
    h = [2, 3, 5]
    acc = A.summarize(h, num_draft_tokens=3)
    assert acc.p == pytest.approx((0.8, 0.5))
    assert acc.alpha == pytest.approx((0.8, 0.625))
    assert acc.accept_len == pytest.approx(1 + 0.8 + 0.5)
    assert acc.accept_rate == pytest.approx((3 + 10) / (10 * 2))
    assert acc.verifies == 10


def test_histogram_from_phase_stream_lists():
    assert A.histogram([2, 3, 0, 2]) == [1, 0, 2, 1]
    assert A.histogram([], size=3) == [0, 0, 0]
    with pytest.raises(ValueError):
        A.histogram([-1])


def test_empty_histogram_is_not_available():
    acc = A.summarize([0, 0, 0], num_draft_tokens=3)
    assert all(math.isnan(x) for x in acc.p) and math.isnan(acc.accept_len)
    assert math.isnan(acc.accept_rate)


def test_positions_pad_deep_zeros():
    acc = A.summarize([4], num_draft_tokens=4, positions=3)
    assert acc.p == (0.0, 0.0, 0.0)
    assert acc.accept_len == 1.0


@given(hists)
def test_p_is_a_nonincreasing_probability_starting_at_or_below_one(h):
    p = A.position_acceptance(h)
    assert all(0 <= x <= 1 for x in p)
    assert all(a >= b - 1e-12 for a, b in zip(p, p[1:]))


@given(hists)
def test_tau_equals_one_plus_mean_accepted(h):
    total = sum(h)
    mean = sum(j * c for j, c in enumerate(h)) / total
    acc = A.summarize(h)
    assert acc.accept_len == pytest.approx(1 + mean)
    assert A.accept_length(acc.p) == pytest.approx(1 + mean)


@given(hists)
def test_alpha_products_give_back_p(h):
    p = A.position_acceptance(h)
    alpha = A.conditional_acceptance(p)
    prod = 1.0
    for k, (pk, ak) in enumerate(zip(p, alpha)):
        if math.isnan(ak):
            # Only after an unreachable position (p_(k-1) == 0).
            assert k > 0 and p[k - 1] == 0
            break
        prod *= ak
        assert prod == pytest.approx(pk)


@given(hists, st.integers(0, 12))
def test_tau_of_s_is_monotone_in_s(h, s):
    p = A.position_acceptance(h)
    assert A.accept_length(p, s) <= A.accept_length(p, s + 1) + 1e-12


@given(st.lists(st.integers(0, 50), max_size=8), st.lists(st.integers(0, 50), max_size=8))
def test_delta_undoes_add(a, b):
    n = max(len(a), len(b))
    assert A.histogram_delta(A.add_histograms(a, b), a) == b + [0] * (n - len(b))
    if any(x > 0 for x in a):
        assert A.histogram_delta([0] * len(a), a) is None   # a counter went down: server restarted


@given(hists)
def test_accept_rate_matches_sglang_definition(h):
    n = len(h)   # num_draft_tokens - 1 = deepest position
    rate = A.accept_rate(h, n)
    correct = sum(j * c for j, c in enumerate(h))
    if n - 1 > 0:
        assert rate == pytest.approx(correct / (sum(h) * (n - 1)))
    else:
        assert math.isnan(rate)
