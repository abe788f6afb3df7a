"""The plugin's hooks applied by SGLang 0.5.23's own HookRegistry, on CPU with torch.

What is real: SGLang's hook registry (imported from the wheel), SGLang's adaptive step policy
and controller (AdaptiveStepSlot, AdaptiveSpeculativeParams, AdaptiveController) and its
/set_internal_state dispatcher (SchedulerInternalStateController.set_internal_state with
UpdateRejected/_UpdateHandler) and http_server.launch_server (sglang_http_launch), compiled from
the wheel's source; torch's profiler; the stream files. What is a stand-in: see
sglang_scheduler.py (the worker classes and the scheduler object).
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from probes.inserver import sglang_plugin
from probes.inserver.sglang_stream import read_records
from sglang_scheduler import internal_state, scheduler_env, server as _server_of

torch.set_num_threads(1)

@pytest.fixture
def sglang(sglang_target, monkeypatch, tmp_path):
    with scheduler_env(sglang_target, tmp_path, monkeypatch) as ns:
        yield ns


class _Mode:
    def __init__(self, extend):
        self.extend = extend

    def is_extend(self):
        return self.extend


def _batch(bs=2, extend=False, ctx=None):
    # reqs: SGLang's Req keeps host-side id lists; `seqlen` is their total (a property there too)
    reqs = [SimpleNamespace(seqlen=n) for n in (ctx or [100 + i for i in range(bs)])]
    return SimpleNamespace(forward_mode=_Mode(extend), is_extend_in_batch=False,
                           seq_lens=torch.zeros(bs), x=torch.randn(bs, 32), reqs=reqs)


def _server(ns, adaptive_cfg=None, **kw):
    return _server_of(ns, adaptive_cfg, **kw)


def _read(directory, **kw):
    """The stream as a reader sees it once the plugin's periodic flush has run."""
    sglang_plugin._probe.flush(force=True)
    return read_records(directory, **kw)


def _set(ctl, **args):
    return ctl.set_internal_state(SimpleNamespace(server_args=args))


def _loop(worker, n, accepted=(2, 2)):
    """The scheduler's order: run a batch, then (one iteration late) process the previous result."""
    prev = None
    for _ in range(n):
        worker.forward_batch_generation(_batch(len(accepted)))
        if prev is not None:
            worker.on_verify_complete_cpu(list(prev), batch_size=len(prev))
        prev = accepted
    worker.on_verify_complete_cpu(list(prev), batch_size=len(prev))


def test_hooks_were_applied_by_sglang(sglang):
    for name in sglang_plugin.SCHEDULER_HOOKS:
        assert sglang_plugin.TARGETS[name] in sglang.registry._patched
    assert sglang.ew.EAGLEWorkerV2.verify.__wrapped__.__name__ == "verify"


def test_no_lease_means_no_timing_and_no_stream(sglang):
    worker, _ = _server(sglang)
    _loop(worker, 5)
    assert sglang_plugin._probe.timeline is None
    assert not list(sglang.dir.iterdir())


def test_lease_granted_over_set_internal_state_produces_records(sglang):
    worker, ctl = _server(sglang)
    assert _set(ctl, specdecode_timers=60) is True
    _loop(worker, 12, accepted=(1, 3))
    worker.forward_batch_generation(_batch(2))        # one more call resolves the tail
    worker.forward_batch_generation(_batch(2, extend=True))   # prefill: passes through untimed
    page = _read(sglang.dir, after=0, limit=100)
    recs = page["records"]
    assert len(recs) >= 10 and page["dropped"] == 0
    r = recs[0]
    assert r["steps"] == 3 and r["topk"] == 1 and r["num_draft_tokens"] == 4 and r["bs"] == 2
    assert r["placement"] == "sharded" and r["rank"] == 0
    assert r["accepted"] == [1, 3] and r["committed"] == 6
    for ph in ("draft", "verify", "draft_extend"):
        assert r["phase_ms"][ph] > 0, ph
    total = sum(r["phase_ms"].values())
    assert total == pytest.approx(r["wall_ms"], rel=0.05, abs=0.05)
    assert [x["seq"] for x in recs] == list(range(1, len(recs) + 1))
    # The target forward was timed inside verify only; prefill forwards were not.
    assert worker.target_worker.calls.count(True) == 13


def test_lease_zero_turns_timing_off(sglang):
    worker, ctl = _server(sglang)
    _set(ctl, specdecode_timers=60)
    _loop(worker, 3)
    assert _set(ctl, specdecode_timers=0) is True
    n = len(_read(sglang.dir, limit=100)["records"])
    _loop(worker, 6)
    assert len(_read(sglang.dir, limit=100)["records"]) <= n + 3   # only the tail resolves


def test_stream_writes_are_batched_and_flushed_when_the_lease_ends(sglang, monkeypatch):
    monkeypatch.setattr(sglang_plugin, "FLUSH_EVERY_S", 3600.0)
    worker, ctl = _server(sglang)
    _set(ctl, specdecode_timers=60)
    _loop(worker, 10)
    assert read_records(sglang.dir)["records"] == [] and sglang_plugin._probe.outbox
    _set(ctl, specdecode_timers=0)
    worker.forward_batch_generation(_batch(2))     # the cheap path pushes out what is left
    assert len(read_records(sglang.dir, limit=100)["records"]) >= 8
    assert sglang_plugin._probe.outbox == []


def test_bad_lease_is_refused_with_the_reason(sglang, caplog):
    _, ctl = _server(sglang)
    with caplog.at_level(logging.WARNING):
        assert _set(ctl, specdecode_timers=-5) is False
    assert "specdecode_timers must be between 0 and" in caplog.text


def test_pin_refused_without_adaptive_and_sglang_keys_still_work(sglang, caplog):
    _, ctl = _server(sglang)
    with caplog.at_level(logging.WARNING):
        assert _set(ctl, specdecode_num_steps=2) is False
    assert "needs SGLang's adaptive controller" in caplog.text
    assert "--speculative-adaptive" in caplog.text
    with caplog.at_level(logging.WARNING):
        assert _set(ctl, not_a_key=1) is False
    assert "Updating not_a_key is not supported." in caplog.text


def test_pin_drives_sglangs_adaptive_controller(sglang, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "adaptive.json"
    cfg.write_text('{"warmup_batches": 0, "update_interval": 1, "ema_alpha": 1.0,'
                   ' "1": {"candidate_steps": [1, 2, 3, 4]}}')
    worker, ctl = _server(sglang, str(cfg))
    assert set(worker.adaptive_controller._states) == {1, 2, 3, 4}
    _set(ctl, specdecode_timers=60)

    # SGLang's own policy first: full acceptance climbs to the top tier.
    _loop(worker, 4, accepted=(4, 4))
    assert worker.speculative_num_steps == 4

    assert _set(ctl, specdecode_num_steps=1) is True
    assert worker.speculative_num_steps == 1                 # swapped at once
    _loop(worker, 6, accepted=(4, 4))                        # the policy would climb again...
    assert worker.speculative_num_steps == 1                 # ...but the pin holds
    worker.forward_batch_generation(_batch(2, ctx=[700, 5000]))
    worker.on_verify_complete_cpu([1, 0], batch_size=2)
    recs = _read(sglang.dir, limit=1000)["records"]
    assert recs[-1]["steps"] == 1 and recs[-1]["num_draft_tokens"] == 2
    assert recs[-1]["ctx"] == [700, 5000] and recs[-1]["accepted"] == [1, 0]
    # SGLang's own climb (3 -> 4) kept the epoch, and its records say the controller chose; the
    # pin moved the epoch once, and pinned records are the operator's choice
    before_pin = [r for r in recs if r["epoch"] == recs[0]["epoch"]]
    assert {r["steps"] for r in before_pin} >= {3, 4} and all(r["adaptive"] for r in before_pin)
    assert {r["epoch"] for r in recs} == {recs[0]["epoch"], recs[0]["epoch"] + 1}
    assert all(r["steps"] == 1 and r["adaptive"] is False for r in recs if r["epoch"] > recs[0]["epoch"])

    assert _set(ctl, specdecode_num_steps=7) is False        # never captured
    assert worker.speculative_num_steps == 1
    assert _set(ctl, specdecode_num_steps=-1) is True        # back to SGLang's policy
    _loop(worker, 4, accepted=(4, 4))
    assert worker.speculative_num_steps > 1


# SGLang's default tiers {1:[1,3,5,7], 8:[0,1,3], 32:[0,1], 64:[0]}, launched at steps 3 with the
# spec-decode graph sizes up to 48 and 48 requests at most: what each tier covers, by SGLang's _route.
DEFAULT_COVER = {"0": [[8, 48]], "1": [[1, 48]], "3": [[1, 48]], "5": [[1, 7]], "7": [[1, 7]]}


def _graph_bs(max_bs=48):
    from probes.sglang_tiers import decode_graph_bs
    return decode_graph_bs(max_bs)


def test_the_default_launch_publishes_what_each_tier_covers(sglang):
    _, ctl = _server(sglang, None, adaptive=True, graph_bs=_graph_bs(), launch_steps=3)
    st = internal_state(ctl)
    pin = st["specdecode_pinnable_steps"]
    assert st["effective_max_running_requests_per_dp"] == 48          # SGLang's own key, same call
    assert pin["max_bs"] == 48 and pin["launch"] == 3 and pin["graph_bs"] == _graph_bs()
    # every size 1..8 is a graph size, so 5 and 7 stop at bs 7; 3 (the launch's) runs everywhere;
    # slot 64 never runs with 48 requests at most
    assert pin["steps"] == DEFAULT_COVER
    assert [sl["bs"] for sl in pin["slots"]] == [1, 8, 32, 64]
    assert pin["slots"][0]["candidate_steps"] == [1, 3, 5, 7] and pin["slots"][0]["down_hysteresis"] == -0.25


def test_a_pin_holds_only_where_its_tier_has_graphs_and_records_say_so(sglang, caplog):
    worker, ctl = _server(sglang, None, adaptive=True, graph_bs=_graph_bs(), launch_steps=3)
    _set(ctl, specdecode_timers=60)
    with caplog.at_level(logging.INFO):
        assert _set(ctl, specdecode_num_steps=5) is True
    assert "steps pinned to 5 at bs 1-7 only" in caplog.text
    for bs in (2, 2, 16, 16, 2):
        worker.forward_batch_generation(_batch(bs))
        worker.on_verify_complete_cpu([1] * bs, batch_size=bs)
    worker.forward_batch_generation(_batch(2))
    recs = [r for r in _read(sglang.dir, limit=100)["records"] if "pinned" in r]
    by_bs = {(r["bs"], r["steps"], r["pinned"], r["adaptive"]) for r in recs}
    # bs 16 routes to slot 8 ([0, 1, 3]): SGLang's policy runs its tier there, read after the switch
    assert (2, 5, True, False) in by_bs and (16, 3, False, True) in by_bs
    assert not any(r["bs"] == 16 and r["steps"] == 5 for r in recs)


def test_where_the_pin_does_not_hold_sglangs_policy_keeps_learning(sglang):
    """Pinned to 5 (bs 1-7): at bs 16 (slot 8, candidates 0 1 3) SGLang's policy runs and is fed,
    so with nothing accepted it steps down there; at bs 2 the pin holds and nothing moves."""
    worker, ctl = _server(sglang, None, adaptive=True, graph_bs=_graph_bs(), launch_steps=3)
    _set(ctl, specdecode_timers=60)
    assert _set(ctl, specdecode_num_steps=5) is True
    for _ in range(25):
        worker.forward_batch_generation(_batch(16))
        worker.on_verify_complete_cpu([0] * 16, batch_size=16)
    for _ in range(4):
        worker.forward_batch_generation(_batch(2))
        worker.on_verify_complete_cpu([0, 0], batch_size=2)
    recs = _read(sglang.dir, limit=1000)["records"]
    at16 = [r["steps"] for r in recs if r["bs"] == 16]
    assert at16[0] == 3 and at16[-1] < 3, at16          # the slot's own policy moved
    at2 = [r["steps"] for r in recs if r["bs"] == 2]
    assert at2 and set(at2) == {5}, at2                 # where the pin holds nothing moves


def test_pins_with_no_batch_size_or_no_graphs_are_refused_with_the_fix(sglang, caplog):
    _, ctl = _server(sglang, None, adaptive=True, graph_bs=_graph_bs(), launch_steps=3,
                     max_running_requests=4)
    with caplog.at_level(logging.WARNING):
        assert _set(ctl, specdecode_num_steps=0) is False       # slots 8+ only; 4 requests at most
        assert _set(ctl, specdecode_num_steps=2) is False       # never captured
    assert "specdecode_num_steps=0 never runs here: only slots bs >= 8, bs >= 32, bs >= 64 list it" in caplog.text
    assert "specdecode_num_steps=2 has no CUDA graphs" in caplog.text
    assert "specdecode-tune sglang-flags" in caplog.text
    assert _set(ctl, specdecode_num_steps=7) is True

def test_verify_spans_in_a_real_torch_profiler_trace(sglang, tmp_path):
    """Profiling needs no timer lease; the trace gets an explicit verify range, and the
    team's trace analyser splits verify / verify_sample with it."""
    from probes.trace_analysis import analyze_file

    worker, _ = _server(sglang)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with torch.profiler.record_function("scheduler.run_batch"):
                worker.forward_batch_generation(_batch(4))
    names = [e.name for e in prof.events()]
    assert names.count(sglang_plugin.VERIFY_SPAN) == 3
    assert names.count(sglang_plugin.SAMPLE_SPAN) == 3
    path = tmp_path / "1764490000.5-TP-0.trace.json"
    prof.export_chrome_trace(str(path))
    rank = analyze_file(path)
    assert len(rank.iterations) == 3
    for it in rank.iterations:
        for phase in ("draft", "verify", "verify_sample", "draft_extend"):
            assert it.phases[phase].ms > 0, phase
    spans = {(e["name"]): e for e in json.loads(path.read_text())["traceEvents"]
             if e.get("name") in (sglang_plugin.VERIFY_SPAN, sglang_plugin.SAMPLE_SPAN)}
    outer, inner = spans[sglang_plugin.VERIFY_SPAN], spans[sglang_plugin.SAMPLE_SPAN]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_http_routes_are_added_by_sglangs_launch_whatever_the_flags(sglang):
    from starlette.testclient import TestClient

    worker, ctl = _server(sglang)
    _set(ctl, specdecode_timers=60)
    _loop(worker, 8)
    worker.forward_batch_generation(_batch(2))
    sglang_plugin._probe.flush(force=True)
    sglang.http.launch_server(SimpleNamespace(enable_metrics=False))   # SGLang's, now hooked
    sglang.http.launch_server(SimpleNamespace(enable_metrics=False))   # a second launch adds none
    app = sglang.served[0]
    assert app is sglang.http.app
    assert [r.path for r in app.routes] == ["/specdecode/phases", "/specdecode/streams"]
    with TestClient(app) as client:
        r = client.get("/specdecode/phases", params={"after": 2, "limit": 3})
        assert r.status_code == 200
        body = r.json()
        assert [x["seq"] for x in body["records"]] == [3, 4, 5] and body["next"] == 5
        assert client.get("/specdecode/phases?limit=zero").status_code == 400
        assert client.get("/specdecode/streams").json()["streams"] == [{"dp": 0, "rank": 0}]


def test_a_failing_probe_turns_itself_off_and_sglang_keeps_running(sglang, monkeypatch, caplog):
    worker, ctl = _server(sglang)
    _set(ctl, specdecode_timers=60)

    def broken(*a, **k):
        raise RuntimeError("no events today")

    monkeypatch.setattr(sglang_plugin, "PhaseTimeline", broken)
    with caplog.at_level(logging.WARNING):
        out = worker.forward_batch_generation(_batch(2))
    assert out.shape == (2,)
    assert "phase timers off" in caplog.text
    assert _set(ctl, specdecode_timers=60) is False
