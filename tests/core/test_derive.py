"""Derivers as pure state machines: counter rates, restarts, acceptance from tail counters, phase
pages with an epoch change inside one page, gaps, and a restarted sequence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from tuner.backends.derive import MetricsDeriver, PhaseStreamReader
from tuner.backends.promtext import parse_metrics
from tuner.core import series as S
from tuner.core.events import EventKind


def metrics(tokens, tail=None, phase=None, iters=None):
    lines = [f'sglang:realtime_tokens_total{{tp_rank="0",mode="decode"}} {tokens}']
    for k, v in enumerate(tail or []):
        lines.append(f'specdecode:accept_position_total{{k="{k}"}} {v}')
    for p, v in (phase or {}).items():
        lines.append(f'specdecode:phase_seconds_total{{phase="{p}",rank="0"}} {v}')
        lines.append(f'specdecode:phase_seconds_total{{phase="{p}",rank="1"}} {v * 10}')
    if iters is not None:
        lines.append(f'specdecode:iterations_total{{rank="0"}} {iters}')
    return parse_metrics("\n".join(lines) + "\n")


def by(samples):
    return {s.series: s.value for s in samples}


def test_rates_and_acceptance_from_tail_counters():
    d = MetricsDeriver(acceptance=True, phases=True)
    assert S.SERVER_TOK_PER_S not in by(d.update(10.0, metrics(100, [10, 8, 5, 1], {"draft": 1.0}, 50)))
    out = by(d.update(10.5, metrics(150, [20, 16, 9, 1], {"draft": 1.2}, 60), {"speculative_num_steps": 3,
                                                                             "speculative_num_draft_tokens": 4}))
    assert out[S.SERVER_TOK_PER_S] == pytest.approx(100.0)
    # 10 rounds: >=1 accepted 8, >=2 accepted 4, >=3 accepted 0.
    assert out[S.accept_pos(1)] == pytest.approx(0.8)
    assert out[S.accept_pos(2)] == pytest.approx(0.4)
    assert out[S.accept_pos(3)] == 0.0
    assert out[S.SPEC_ACCEPT_LEN] == pytest.approx(2.2)
    assert out[S.phase_ms("draft")] == pytest.approx(200.0 / 10)       # rank 0's seconds / iterations


def test_restart_gives_no_rate_then_resumes():
    d = MetricsDeriver()
    d.update(1.0, metrics(1000))
    assert S.SERVER_TOK_PER_S not in by(d.update(2.0, metrics(10)))    # went down: restarted
    assert by(d.update(3.0, metrics(30)))[S.SERVER_TOK_PER_S] == pytest.approx(20.0)


def test_no_verifies_is_not_available_not_zero():
    d = MetricsDeriver(acceptance=True)
    d.update(1.0, metrics(0, [5, 3]))
    out = by(d.update(2.0, metrics(0, [5, 3]), {"speculative_num_steps": 1}))
    assert math.isnan(out[S.SPEC_ACCEPT_LEN]) and math.isnan(out[S.accept_pos(1)])
    assert out[S.SERVER_TOK_PER_S] == 0.0


def rec(seq, t, epoch, steps, accepted, draft_ms=2.0):
    return {"seq": seq, "t": t, "epoch": epoch, "steps": steps, "topk": 1, "num_draft_tokens": steps + 1,
            "placement": "sharded", "bs": len(accepted), "wall_ms": 10.0,
            "phase_ms": {"draft": draft_ms, "verify": 5.0, "verify_sample": 0.5, "draft_extend": 1.0, "other": 0.5},
            "comm_ms": {"draft": 1.0, "verify": 2.0, "verify_sample": 0.0, "draft_extend": 0.0, "other": 0.0},
            "accepted": accepted}


def test_phase_pages_split_at_an_epoch_change():
    r = PhaseStreamReader()
    s, e = r.update(50.0, {"next": 2, "dropped": 0, "records": [rec(1, 900.0, 1, 3, [3]), rec(2, 900.1, 1, 3, [3])]})
    assert s == [] and e == [] and r.config["speculative_num_steps"] == 3
    page = {"next": 6, "dropped": 0, "records": [rec(3, 900.2, 1, 3, [2, 0], 2.0), rec(4, 900.3, 1, 3, [1, 1], 4.0),
                                                 rec(5, 900.4, 2, 1, [1, 1], 7.0), rec(6, 900.6, 2, 1, [0, 1], 9.0)]}
    s, e = r.update(51.0, page)
    [change] = e
    assert change.kind == EventKind.CONFIG_CHANGED and change.t == pytest.approx(51.0 - 0.2)
    assert change.data["old"]["speculative_num_steps"] == 3 and change.data["new"]["speculative_num_steps"] == 1
    draft = [x for x in s if x.series == S.phase_ms("draft")]
    assert [x.value for x in draft] == [3.0, 8.0]
    assert draft[0].t == pytest.approx(51.0 - 0.3) and draft[1].t == 51.0
    pos1 = [x.value for x in s if x.series == S.accept_pos(1)]
    assert pos1 == [pytest.approx(3 / 4), pytest.approx(3 / 4)]
    assert [x for x in s if x.series == S.accept_pos(3)][0].value == 0.0
    assert not [x for x in s if x.series == S.accept_pos(2) and x.t == 51.0]   # steps=1: one position
    iters = [x.value for x in s if x.series == S.SERVER_ITERATIONS]
    assert iters == [2, 4]
    [ips] = [x for x in s if x.series == S.SERVER_ITER_PER_S]
    assert ips.value == pytest.approx(4 / 0.5)


def test_gap_restart_and_idle():
    r = PhaseStreamReader()
    r.update(1.0, {"next": 10, "dropped": 0, "records": [rec(10, 5.0, 1, 3, [1])]})
    s, e = r.update(2.0, {"next": 20, "dropped": 4, "records": [rec(15, 6.0, 1, 3, [1])]})
    assert [x.kind for x in e] == [EventKind.PHASE_GAP] and e[0].data["dropped"] == 4
    s, e = r.update(3.0, {"next": 20, "dropped": 0, "records": []})
    assert [(x.series, x.value) for x in s] == [(S.SERVER_ITER_PER_S, 0.0)]
    s, e = r.update(4.0, {"next": 2, "dropped": 0, "records": [rec(1, 1.0, 1, 3, [1]), rec(2, 1.1, 1, 3, [1])]})
    assert s == [] and e == [] and r.cursor == 2        # a restarted server: re-adopted, not a change
    with pytest.raises(ValueError):
        r.update(5.0, {"oops": 1})


@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), min_size=1, max_size=30))
def test_stream_acceptance_matches_the_histogram_definition(batches):
    r = PhaseStreamReader()
    r.update(0.0, {"next": 0, "dropped": 0, "records": []})
    recs = [rec(i + 1, 10.0 + i * 0.01, 1, 4, acc) for i, acc in enumerate(batches)]
    s, _ = r.update(1.0, {"next": len(recs), "dropped": 0, "records": recs})
    flat = [a for b in batches for a in b]
    for k in range(1, 5):
        [pk] = [x.value for x in s if x.series == S.accept_pos(k)]
        assert pk == pytest.approx(sum(a >= k for a in flat) / len(flat))
    [tau] = [x.value for x in s if x.series == S.SPEC_ACCEPT_LEN]
    assert tau == pytest.approx(1 + sum(flat) / len(flat))


junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=12)


@given(st.lists(st.fixed_dictionaries({}, optional={
    "seq": junk, "t": junk, "epoch": junk, "steps": junk, "num_draft_tokens": junk, "bs": junk,
    "wall_ms": junk, "phase_ms": junk, "comm_ms": junk, "accepted": junk, "ctx": junk}), max_size=5), junk)
def test_malformed_phase_records_never_crash(records, nxt):
    r = PhaseStreamReader()
    r.update(0.0, {"next": 0, "dropped": 0, "records": []})
    try:
        r.update(1.0, {"next": nxt, "dropped": 0, "records": records})
    except ValueError as e:
        assert "\n" not in str(e)


def test_records_without_comm_parts_say_not_available():
    r = PhaseStreamReader()
    r.update(0.0, {"next": 0, "dropped": 0, "records": []})
    plugin_like = rec(1, 5.0, 1, 3, [1])
    del plugin_like["comm_ms"]
    s, _ = r.update(1.0, {"next": 1, "dropped": 0, "records": [plugin_like]})
    v = {x.series: x.value for x in s}
    assert v[S.phase_ms("draft")] == 2.0 and math.isnan(v[S.phase_comm_ms("draft")])


def test_a_phase_missing_from_comm_ms_is_not_available():
    """The engine leaves a phase out of comm_ms when its collectives ran inside CUDA graphs."""
    r = PhaseStreamReader()
    r.update(0.0, {"next": 0, "dropped": 0, "records": []})
    graphed = rec(1, 5.0, 1, 3, [1])
    del graphed["comm_ms"]["draft"]
    s, _ = r.update(1.0, {"next": 1, "dropped": 0, "records": [graphed]})
    v = {x.series: x.value for x in s}
    assert math.isnan(v[S.phase_comm_ms("draft")])
    assert v[S.phase_comm_ms("verify")] == 2.0 and v[S.phase_comm_ms("verify_sample")] == 0.0
