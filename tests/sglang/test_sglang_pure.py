"""Pure logic of the SGLang plugin: event bookkeeping, phase composition, pin/lease validation,
the ring-file stream, and the HTTP reply of /specdecode/phases. No SGLang, no device."""

from __future__ import annotations

import json

import pytest

from probes.inserver.sglang_plugin import phases_reply, streams_reply
from probes.inserver.sglang_steps import (
    AdaptiveView, Lease, Refused, StepPin, check_lease, check_pin, coverage_of,
)
from probes.inserver.sglang_stream import (
    RingWriter, choose_stream_dir, list_streams, read_records, stream_dir,
)
from probes.inserver.sglang_timing import HostEvent, PhaseTimeline, compose_phases


class ScriptedEvent:
    """Unit-test event: a device clock set by the test, complete only when the test says so."""
    clock = [0.0]
    done_upto = [float("inf")]

    def __init__(self):
        self.t = None

    def record(self):
        self.t = ScriptedEvent.clock[0]

    def query(self):
        return self.t <= ScriptedEvent.done_upto[0]

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def _tick(dt):
    ScriptedEvent.clock[0] += dt


def _iteration(tl, bs=2, steps=3, draft=0.002, verify=0.005, target=0.004, extend=0.001, **meta):
    tl.begin(bs=bs, steps=steps, topk=1, num_draft_tokens=steps + 1, placement="sharded", **meta)
    h = tl.open("draft"); _tick(draft); tl.close(h)
    h = tl.open("verify_all"); _tick((verify - target) / 2)
    t = tl.open("target_verify"); _tick(target); tl.close(t)
    _tick((verify - target) / 2); tl.close(h)
    _tick(0.0005)
    h = tl.open("draft_extend"); _tick(extend); tl.close(h)
    tl.end()


@pytest.fixture
def tl():
    ScriptedEvent.clock[0] = 0.0
    ScriptedEvent.done_upto[0] = float("inf")
    return PhaseTimeline(ScriptedEvent, rank=0, accept_wait=2, clock=lambda: 1000.0)


def test_compose_phases_splits_verify_and_never_goes_negative():
    p = compose_phases({"draft": 2, "verify_all": 5, "target_verify": 4, "draft_extend": 1}, 9)
    assert p == {"prefill": 0, "draft": 2, "verify": 4, "verify_sample": 1, "draft_extend": 1, "other": 1}
    assert compose_phases({"verify_all": 5}, 4)["other"] == 0.0
    assert compose_phases({"verify_all": 5}, 6)["verify"] == 5     # no target mark: all verify


def test_record_times_and_accepted(tl):
    _iteration(tl)
    tl.accepted([1, 3])
    [r] = tl.poll()
    assert r["seq"] == 1 and r["bs"] == 2 and r["steps"] == 3 and r["num_draft_tokens"] == 4
    assert r["phase_ms"] == pytest.approx({"prefill": 0, "draft": 2, "verify": 4, "verify_sample": 1,
                                           "draft_extend": 1, "other": 0.5})
    assert r["wall_ms"] == pytest.approx(8.5)
    assert r["accepted"] == [1, 3] and r["committed"] == 6
    assert json.loads(json.dumps(r)) == r


def test_poll_never_reports_an_iteration_the_device_has_not_finished(tl):
    ScriptedEvent.done_upto[0] = -1.0
    _iteration(tl)
    tl.accepted([0, 0])
    assert tl.poll() == [] and tl.pending == 1
    ScriptedEvent.done_upto[0] = float("inf")
    assert [r["seq"] for r in tl.poll()] == [1]


def test_accepted_arrive_one_iteration_late_and_match_by_order(tl):
    _iteration(tl, bs=2)
    _iteration(tl, bs=3)
    tl.accepted([1, 1])          # for iteration 1, reported after iteration 2 was launched
    out = tl.poll()
    assert [r["seq"] for r in out] == [1] and out[0]["accepted"] == [1, 1]
    tl.accepted([2, 0, 1])
    assert tl.poll()[0]["accepted"] == [2, 0, 1]


def test_missing_accepted_gives_up_after_a_few_polls_without_inventing_them(tl):
    _iteration(tl)
    assert tl.poll() == [] and tl.poll() == []
    [r] = tl.poll()
    assert "accepted" not in r and "committed" not in r


def test_a_batch_size_mismatch_skips_the_unreported_iteration(tl):
    _iteration(tl, bs=4)          # e.g. an idle batch the scheduler never reports
    _iteration(tl, bs=2)
    tl.accepted([1, 2])
    recs = tl.poll()
    assert [r["seq"] for r in recs] == [1, 2]
    assert "accepted" not in recs[0] and recs[1]["accepted"] == [1, 2]


def test_epoch_moves_when_the_config_changes(tl):
    _iteration(tl, steps=3); tl.accepted([0, 0])
    _iteration(tl, steps=3); tl.accepted([0, 0])
    _iteration(tl, steps=5); tl.accepted([0, 0])
    assert [r["epoch"] for r in tl.poll()] == [0, 0, 1]


def test_adaptive_tier_switches_keep_the_epoch_and_a_pin_moves_it(tl):
    # The contract: the controller's tier switches are not config changes; each record says the
    # steps it ran and that a controller chose them. The operator's pin is a change.
    for steps in (3, 1, 3):
        _iteration(tl, steps=steps, controller=True, adaptive=True); tl.accepted([0, 0])
    tl.operator_change()
    _iteration(tl, steps=1, controller=True, adaptive=False); tl.accepted([0, 0])   # pinned
    recs = tl.poll()
    assert [(r["epoch"], r["steps"], r["num_draft_tokens"], r["adaptive"]) for r in recs] == [
        (0, 3, 4, True), (0, 1, 2, True), (0, 3, 4, True), (1, 1, 2, False)]


def test_records_carry_each_requests_context_aligned_with_accepted(tl):
    _iteration(tl, bs=2, ctx=[300, 4100]); tl.accepted([2, 0])
    _iteration(tl, bs=2, ctx=[300]); tl.accepted([1, 1])       # not aligned: left out, not guessed
    _iteration(tl, bs=2); tl.accepted([1, 1])
    a, b, c = tl.poll()
    assert a["ctx"] == [300, 4100] and a["accepted"] == [2, 0] and a["adaptive"] is False
    assert "ctx" not in b and "ctx" not in c


def test_abandoned_iteration_is_not_reported_and_events_are_reused(tl):
    tl.begin(bs=1, steps=1, topk=1, num_draft_tokens=2)
    tl.open("draft")
    tl.abandon()
    assert tl.pending == 0 and not tl.active
    _iteration(tl, bs=1); tl.accepted([1])
    assert len(tl.poll()) == 1
    assert len(tl.pool._free) > 0


def test_spans_outside_an_iteration_are_ignored(tl):
    assert tl.open("draft") == -1
    tl.close(-1)
    assert tl.pending == 0


def test_overflow_drops_oldest_instead_of_growing(tl):
    tl.max_pending = 3
    ScriptedEvent.done_upto[0] = -1.0
    for _ in range(5):
        _iteration(tl)
    assert tl.pending == 3 and tl.dropped == 2


def test_host_events_time_real_work():
    tl = PhaseTimeline(HostEvent, accept_wait=0)
    tl.begin(bs=1, steps=1, topk=1, num_draft_tokens=2)
    h = tl.open("draft")
    sum(range(20000))
    tl.close(h)
    tl.end()
    [r] = tl.poll()
    assert 0 < r["phase_ms"]["draft"] <= r["wall_ms"]


VIEW = AdaptiveView(captured=frozenset({1, 2, 3, 5}), slots=((1, (1, 2, 3, 5)),))


@pytest.mark.parametrize("value, expected", [(3, 3), (3.0, 3), (1, 1), (-1, None)])
def test_pin_accepts(value, expected):
    assert check_pin(value, VIEW) == expected


@pytest.mark.parametrize("value, view, words", [
    (3, None, "--speculative-adaptive"),
    (4, VIEW, "has no CUDA graphs"),
    (2.5, VIEW, "whole number"),
    (-2, VIEW, ">= 0"),
    ("3", VIEW, "must be a number"),
    (True, VIEW, "must be a number"),
    (float("nan"), VIEW, "whole number"),
])
def test_pin_refusals_say_why(value, view, words):
    with pytest.raises(Refused, match=words):
        check_pin(value, view)


def test_a_pin_that_holds_at_some_batch_sizes_is_taken_and_one_at_none_is_refused():
    view = AdaptiveView(frozenset({0, 1, 3}), ((1, (1, 3)), (8, (0, 1))), launch=1, graph_bs=(1, 2, 4, 8))
    slots = dict(view.slots)
    cands = lambda bs: slots[8 if bs > 4 else 1]     # bs 5.. pad to graph size 8
    assert check_pin(3, view, coverage_of(view, 16, cands)) == 3          # bs 1-4 only
    with pytest.raises(Refused, match=r"specdecode_num_steps=0 never runs here: only slots bs >= 8"):
        check_pin(0, view, coverage_of(view, 4, cands))                    # 4 requests at most
    assert coverage_of(view, 16, cands) == {0: [[5, 16]], 1: [[1, 16]], 3: [[1, 4]]}


def test_release_needs_no_adaptive_controller():
    assert check_pin(-1, None) is None


def test_lease_and_pin_state():
    assert check_lease(30) == 30.0 and check_lease(0) == 0.0
    for bad in (-1, float("inf"), "x", 10**9):
        with pytest.raises(Refused):
            check_lease(bad)
    lease = Lease()
    assert not lease.on(100.0)
    lease.grant(30, now=100.0)
    assert lease.on(129.0) and not lease.on(130.0)
    lease.grant(0, now=110.0)
    assert not lease.on(111.0)
    assert Lease(always=True).on(0.0)
    pin = StepPin()
    assert pin.steps_for_batch(5) == 5 and not pin.held
    pin.steps, pin.launch = 2, 3
    assert pin.steps_for_batch(5, candidates=(1, 2)) == 2 and pin.pinned and pin.held
    assert pin.steps_for_batch(5, candidates=(0, 1)) == 5 and pin.pinned and not pin.held   # no graphs
    pin.steps = 3                                    # the launch's tier has graphs everywhere
    assert pin.steps_for_batch(5, candidates=(0, 1)) == 3 and pin.held
    pin.steps, pin.graphs = 2, False                 # graphs off: every tier runs anywhere
    assert pin.steps_for_batch(5, candidates=(0, 1)) == 2 and pin.held


def _recs(a, b):
    return [{"seq": s, "t": float(s), "phase_ms": {"draft": 1.0}} for s in range(a, b + 1)]


def test_stream_roundtrip_and_paging(tmp_path):
    w = RingWriter(tmp_path, dp=0, rank=1, capacity=100)
    w.write(_recs(1, 10))
    r = read_records(tmp_path, rank=1, after=0, limit=4)
    assert [x["seq"] for x in r["records"]] == [1, 2, 3, 4] and r["next"] == 4 and r["dropped"] == 0
    r = read_records(tmp_path, rank=1, after=r["next"], limit=100)
    assert [x["seq"] for x in r["records"]] == list(range(5, 11)) and r["next"] == 10
    r = read_records(tmp_path, rank=1, after=10)
    assert r == {"next": 10, "dropped": 0, "records": []}
    assert list_streams(tmp_path) == [{"dp": 0, "rank": 1}]
    w.close()


def test_stream_rotation_keeps_two_files_and_counts_what_a_slow_reader_lost(tmp_path):
    w = RingWriter(tmp_path, dp=0, rank=0, capacity=10)
    w.write(_recs(1, 35))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["specdecode-phases-dp0-tp0.jsonl", "specdecode-phases-dp0-tp0.jsonl.1"]
    r = read_records(tmp_path, after=3, limit=1000)
    assert r["records"][0]["seq"] == 21 and r["dropped"] == 17 and r["next"] == 35


def test_stream_ignores_a_half_written_line_and_garbage(tmp_path):
    w = RingWriter(tmp_path, dp=0, rank=0)
    w.write(_recs(1, 2))
    with open(w.path, "a") as f:
        f.write('not json\n{"seq":3,"t":3.0,"phase_')
    r = read_records(tmp_path)
    assert [x["seq"] for x in r["records"]] == [1, 2]


def test_a_restarted_rank_stream_is_read_from_its_start(tmp_path):
    RingWriter(tmp_path, 0, 0).write(_recs(1, 50))
    w = RingWriter(tmp_path, 0, 0)               # new process: old files removed, seq restarts
    w.write(_recs(1, 3))
    r = read_records(tmp_path, after=50)
    assert [x["seq"] for x in r["records"]] == [1, 2, 3]


def test_unwritable_stream_dir_turns_the_writer_off(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    w = RingWriter(blocker / "sub", 0, 0)
    assert w.error and "cannot write" in w.error
    w.write(_recs(1, 2))                          # must not raise


def test_stream_dir_prefers_ours_then_prometheus():
    assert stream_dir({"PROMETHEUS_MULTIPROC_DIR": "/p"}).name == "p"
    assert stream_dir({"SPECDECODE_STREAM_DIR": "/s", "PROMETHEUS_MULTIPROC_DIR": "/p"}).name == "s"
    assert stream_dir({}) is None


def test_the_launching_process_chooses_the_stream_dir_once(tmp_path):
    env: dict[str, str] = {}
    d, made = choose_stream_dir(env)
    try:
        assert made and d.is_dir() and env["SPECDECODE_STREAM_DIR"] == str(d)
        assert d.stat().st_mode & 0o077 == 0              # private to the server's user
        assert stream_dir(env) == d
        assert choose_stream_dir(env) == (d, False)       # a second call keeps it
    finally:
        d.rmdir()
    assert choose_stream_dir({"SPECDECODE_STREAM_DIR": str(tmp_path)}) == (tmp_path, False)


def test_phases_reply(tmp_path):
    RingWriter(tmp_path, 0, 0).write(_recs(1, 5))
    status, body = phases_reply({"after": "2", "limit": "2"}, tmp_path)
    assert status == 200 and [r["seq"] for r in body["records"]] == [3, 4]
    for bad in ({"after": "x"}, {"limit": "0"}, {"limit": "99999"}, {"rank": "-1"}):
        status, body = phases_reply(bad, tmp_path)
        assert status == 400 and body["error"]["message"].startswith("bad query")
    status, body = phases_reply({}, None)
    assert status == 404 and "SPECDECODE_STREAM_DIR is not set" in body["error"]["message"]
    assert streams_reply(tmp_path)["streams"] == [{"dp": 0, "rank": 0}]
