"""The plugin's hooks applied by SGLang 0.5.23's own HookRegistry, on CPU with torch.

What is real: SGLang's hook registry (imported from the wheel), SGLang's adaptive step policy
and controller (AdaptiveStepSlot, AdaptiveSpeculativeParams, AdaptiveController) and its
/set_internal_state dispatcher (SchedulerInternalStateController.set_internal_state with
UpdateRejected/_UpdateHandler) and http_server.launch_server (sglang_http_launch), compiled from
the wheel's source; torch's profiler; the stream files. What is a stand-in (SGLang's worker needs CUDA kernels that cannot load here): the
EAGLE worker, draft worker and target worker classes, registered under SGLang's module names with
the method names and call order of eagle_worker_v2.py (the contract tests pin those), doing
small CPU matmuls.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from probes.inserver import sglang_plugin
from probes.inserver.sglang_stream import read_records
from sglang_http_launch import build as build_http_launch
from sglang_wheel_code import load_definitions

torch.set_num_threads(1)

EW = "sglang.srt.speculative.eagle_worker_v2"
ASP = "sglang.srt.speculative.adaptive_spec_params"
ART = "sglang.srt.speculative.adaptive_runtime_state"
IST = "sglang.srt.managers.scheduler_components.internal_state"
TPW = "sglang.srt.managers.tp_worker"


def _standin_modules(art: types.ModuleType) -> dict[str, types.ModuleType]:
    """Stand-ins for SGLang's worker classes (see the module docstring)."""
    ew = types.ModuleType(EW)

    class EagleDraftWorker:
        def __init__(self):
            self.speculative_num_steps = 3
            self.w = torch.randn(32, 32)

        def draft(self, batch):
            x = batch.x
            for _ in range(max(self.speculative_num_steps - 1, 1)):
                x = torch.tanh(x @ self.w)
            return x

        def _draft_extend_for_decode(self, batch, batch_output, kv_loc_plan=None):
            return torch.tanh(batch.x @ self.w)

    class EAGLEWorkerV2:
        def __init__(self, target, adaptive_cfg=None):
            self.topk = 1
            self.speculative_num_steps = 3
            self.speculative_num_draft_tokens = 4
            self.device = "cpu"
            self.draft_worker = EagleDraftWorker()
            self.target_worker = target
            self.adaptive_controller = None
            if adaptive_cfg is not None:
                params = sys.modules[ASP].AdaptiveSpeculativeParams(
                    initial_steps=self.speculative_num_steps, cfg_path=adaptive_cfg)
                self.adaptive_controller = art.AdaptiveController(self, params)
                self.adaptive_controller.register(self.build_adaptive_runtime_state(3, 4))
                self.adaptive_controller.init_states(cuda_graph_bs=None)

        # the decode branch of SGLang's forward_batch_generation, in the same call order
        def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
                                     pp_proxy_tensors=None):
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                return self.target_worker.forward_batch_generation(batch)
            self.activate_step_by_batch(batch.seq_lens.shape[0])
            with torch.profiler.record_function("draft"):          # SGLang's spec_stage_span
                verify_input = self.draft_worker.draft(batch)
            out = self.verify(batch)
            with torch.profiler.record_function("draft_extend"):
                self.draft_worker._draft_extend_for_decode(batch, out, kv_loc_plan=verify_input)
            return out

        def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
            logits = self.target_worker.forward_batch_generation(
                batch=None, forward_batch=batch, is_verify=True)
            probs = torch.softmax(logits, -1)                     # acceptance stand-in
            return torch.multinomial(probs, 1).squeeze(-1) + probs.argmax(-1)

        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
            if self.adaptive_controller is not None:
                self.adaptive_controller.on_verify_complete(num_correct_drafts_per_req,
                                                            batch_size=batch_size)

        def activate_step_by_batch(self, batch_size):
            if self.adaptive_controller is not None:
                self.adaptive_controller.activate_step_by_batch(batch_size)

        def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens,
                                         cuda_graph_bs=None):
            return art.SpecRuntimeState(speculative_num_steps, speculative_num_draft_tokens,
                                        None, None, None, None, None, None)

        def apply_runtime_state(self, state):
            self.speculative_num_steps = state.speculative_num_steps
            self.speculative_num_draft_tokens = state.speculative_num_draft_tokens
            self.draft_worker.speculative_num_steps = state.speculative_num_steps

    ew.EagleDraftWorker, ew.EAGLEWorkerV2 = EagleDraftWorker, EAGLEWorkerV2
    tpw = types.ModuleType(TPW)

    class TpModelWorker:
        def __init__(self):
            self.w = torch.randn(32, 64)
            self.calls = []

        def forward_batch_generation(self, batch=None, forward_batch=None, pp_proxy_tensors=None,
                                     is_verify=False, **kw):
            self.calls.append(is_verify)
            x = (forward_batch if forward_batch is not None else batch).x
            name = f"step[VERIFY bs={x.shape[0]}]" if is_verify else "step[EXTEND]"
            with torch.profiler.record_function(name):             # ModelRunner.forward's span
                return torch.tanh(x @ self.w) @ self.w.T @ self.w

    tpw.TpModelWorker = TpModelWorker
    return {EW: ew, TPW: tpw}


@pytest.fixture
def sglang(sglang_target, monkeypatch, tmp_path):
    saved = dict(sys.modules)
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(sglang_target / "sglang")]
    sys.modules["sglang"] = pkg
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.reset()
    log_rank0 = lambda logger, msg: logger.info(msg)      # SGLang's log_info_on_rank0, one process
    asp = load_definitions(sglang_target / "sglang", ASP,
                           ["DEFAULT_ADAPTIVE_CONFIG", "_load_adaptive_config", "AdaptiveStepSlot",
                            "AdaptiveSpeculativeParams"], {"log_info_on_rank0": log_rank0},
                           register_as=ASP)
    art = load_definitions(sglang_target / "sglang", ART, ["SpecRuntimeState", "AdaptiveController"],
                           {}, register_as=ART)
    # set_internal_state only reaches get_context() for server-arg overrides, which our keys
    # never return; the reply struct is a msgspec type in io_struct.
    ist = load_definitions(sglang_target / "sglang", IST,
                           ["UpdateRejected", "SchedulerInternalStateController", "_UpdateHandler",
                            "_override"],
                           {"SetInternalStateReqOutput": lambda updated: updated,
                            "get_context": None}, register_as=IST)
    sys.modules.update(_standin_modules(art))
    served = []
    http = build_http_launch(sglang_target / "sglang", lambda: None, served.append)
    monkeypatch.setenv("SPECDECODE_PLUGIN_ROLE", "all")
    monkeypatch.setenv("SPECDECODE_STREAM_DIR", str(tmp_path))
    monkeypatch.delenv("SPECDECODE_TIMERS", raising=False)
    monkeypatch.setattr(sglang_plugin, "_probe", sglang_plugin._Probe())
    sglang_plugin.register()
    HookRegistry.apply_hooks()
    ns = SimpleNamespace(registry=HookRegistry, asp=asp, art=art, ist=ist, dir=tmp_path,
                         ew=sys.modules[EW], tpw=sys.modules[TPW], http=http, served=served)
    yield ns
    HookRegistry.reset()
    for name in [n for n in sys.modules if n not in saved]:
        del sys.modules[name]
    sys.modules.update(saved)


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


def _server(ns, adaptive_cfg=None):
    worker = ns.ew.EAGLEWorkerV2(ns.tpw.TpModelWorker(), adaptive_cfg)
    ctl = ns.ist.SchedulerInternalStateController(SimpleNamespace(draft_worker=worker), False)
    return worker, ctl


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


def test_pin_refused_for_a_step_some_batch_sizes_lack(sglang, tmp_path_factory, caplog):
    cfg = tmp_path_factory.mktemp("cfg") / "adaptive.json"
    cfg.write_text('{"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}')
    worker, ctl = _server(sglang, str(cfg))
    with caplog.at_level(logging.WARNING):
        assert _set(ctl, specdecode_num_steps=3) is False
    assert "not a candidate for batch sizes >= 8" in caplog.text
    assert _set(ctl, specdecode_num_steps=1) is True


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
