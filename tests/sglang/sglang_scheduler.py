"""A stand-in SGLang 0.5.23 scheduler process for the plugin's hooks, built on SGLang's own code.

What is real: SGLang's hook registry (imported from the wheel), SGLang's adaptive step policy and
controller (AdaptiveStepSlot, AdaptiveSpeculativeParams, AdaptiveController), its internal-state
controller (SchedulerInternalStateController: `/set_internal_state`'s dispatcher with
UpdateRejected/_UpdateHandler, and `get_internal_state`, what `/server_info` returns per scheduler)
and build_memory_usage, compiled from the wheel's source. What is a stand-in (SGLang's worker needs
CUDA kernels that cannot load here): the EAGLE worker, draft worker and target worker classes,
registered under SGLang's module names with the method names and call order of eagle_worker_v2.py
(the contract tests pin those), doing small CPU matmuls; and the scheduler object, a namespace with
the attributes get_internal_state reads.

`scheduler_env` registers all of it and the plugin's hooks, and restores sys.modules afterwards.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import torch

from probes.inserver import sglang_plugin
from sglang_http_launch import build as build_http_launch
from sglang_wheel_code import load_definitions

EW = "sglang.srt.speculative.eagle_worker_v2"
ASP = "sglang.srt.speculative.adaptive_spec_params"
ART = "sglang.srt.speculative.adaptive_runtime_state"
IST = "sglang.srt.managers.scheduler_components.internal_state"
MEM = "sglang.srt.managers.scheduler_components.memory_usage"
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
        def __init__(self, target, adaptive_cfg=None, graph_bs=None, launch_steps=3, adaptive=None):
            self.topk = 1
            self.speculative_num_steps = launch_steps
            self.speculative_num_draft_tokens = launch_steps + 1
            self.device = "cpu"
            self.draft_worker = EagleDraftWorker()
            self.target_worker = target
            self.adaptive_controller = None
            # GB of captured graphs per phase, as the recorded TP8 launch reported them
            self.graph_memory_usage = {"draft_decode": 0.37, "draft_extend": 0.22}
            if adaptive if adaptive is not None else adaptive_cfg is not None:
                params = sys.modules[ASP].AdaptiveSpeculativeParams(
                    initial_steps=self.speculative_num_steps, cfg_path=adaptive_cfg)
                self.adaptive_controller = art.AdaptiveController(self, params)
                # SGLang's order (eagle_worker_v2.py:1390-1413): the launch's state, then the rest
                self.adaptive_controller.register(
                    self.build_adaptive_runtime_state(launch_steps, launch_steps + 1))
                self.adaptive_controller.init_states(cuda_graph_bs=graph_bs)

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



def _internal_state_module(src: Path) -> types.ModuleType:
    """SGLang's internal-state controller. Its imports from the rest of SGLang are supplied here,
    each a stand-in for a process-wide object this test process does not have:
    - get_context(): the resolved server args (an empty dict: the caller merges the recorded ones);
    - get_parallel() / compute_world_size: one TP rank's topology;
    - get_exec(): no elastic EP; envs: SGLANG_EXPOSE_OWN_ENV_VARS off;
    - msgspec_to_builtins: identity (the values are builtins already);
    - the reply structs: namespaces with SGLang's field names."""
    mem = load_definitions(src, MEM, ["combine_graph_memory_usage", "build_memory_usage"],
                           {"merge_graph_memory_usage": lambda t, d: {**(t or {}), **(d or {})}})
    ctx = SimpleNamespace(resolved_server_args_dict=dict, override=lambda *a, **k: None)
    return load_definitions(
        src, IST, ["_DECODE_GRAPH_PHASES", "UpdateRejected", "SchedulerInternalStateController",
                   "_UpdateHandler", "_override"],
        {"SetInternalStateReqOutput": lambda updated: updated,
         "GetInternalStateReqOutput": lambda internal_state: SimpleNamespace(internal_state=internal_state),
         "get_context": lambda: ctx,
         "get_parallel": lambda: SimpleNamespace(dp_size=1, tp_size=1, pp_size=1),
         "compute_world_size": lambda dp_size, tp_size, pp_size: dp_size * tp_size * pp_size,
         "get_exec": lambda: SimpleNamespace(moe=SimpleNamespace(elastic_ep_backend=None)),
         "envs": SimpleNamespace(SGLANG_EXPOSE_OWN_ENV_VARS=SimpleNamespace(get=lambda: False)),
         "exportable_env_vars": dict, "msgspec_to_builtins": lambda x: x,
         "build_memory_usage": mem.build_memory_usage},
        register_as=IST)


@contextmanager
def scheduler_env(sglang_target: Path, stream_dir: Path, monkeypatch) -> Iterator[SimpleNamespace]:
    """SGLang's modules and the plugin's hooks, registered as in a scheduler process."""
    saved = dict(sys.modules)
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(sglang_target / "sglang")]
    sys.modules["sglang"] = pkg
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.reset()
    log_rank0 = lambda logger, msg: logger.info(msg)      # SGLang's log_info_on_rank0, one process
    src = sglang_target / "sglang"
    asp = load_definitions(src, ASP, ["DEFAULT_ADAPTIVE_CONFIG", "_load_adaptive_config", "AdaptiveStepSlot",
                                      "AdaptiveSpeculativeParams"], {"log_info_on_rank0": log_rank0},
                           register_as=ASP)
    art = load_definitions(src, ART, ["SpecRuntimeState", "AdaptiveController"], {}, register_as=ART)
    ist = _internal_state_module(src)
    sys.modules.update(_standin_modules(art))
    served: list = []
    http = build_http_launch(src, lambda: None, served.append)
    monkeypatch.setenv("SPECDECODE_PLUGIN_ROLE", "all")
    monkeypatch.setenv("SPECDECODE_STREAM_DIR", str(stream_dir))
    monkeypatch.delenv("SPECDECODE_TIMERS", raising=False)
    monkeypatch.setattr(sglang_plugin, "_probe", sglang_plugin._Probe())
    sglang_plugin.register()
    HookRegistry.apply_hooks()
    try:
        yield SimpleNamespace(registry=HookRegistry, asp=asp, art=art, ist=ist, dir=stream_dir,
                              ew=sys.modules[EW], tpw=sys.modules[TPW], http=http, served=served)
    finally:
        HookRegistry.reset()
        for name in [n for n in sys.modules if n not in saved]:
            del sys.modules[name]
        sys.modules.update(saved)


def scheduler(worker, max_running_requests: int = 48) -> SimpleNamespace:
    """The attributes of SGLang's Scheduler that the internal-state controller reads (a stand-in)."""
    reporter = SimpleNamespace(last_gen_throughput=0.0, spec_total_num_forward_ct=0,
                               spec_total_num_accept_tokens=0, step_time_dict={})
    runner = SimpleNamespace(weight_load_mem_usage=16.45)
    return SimpleNamespace(
        draft_worker=worker, max_running_requests=max_running_requests, startup_time=0.0,
        metrics_reporter=reporter, tp_worker=SimpleNamespace(model_runner=runner,
                                   graph_memory_usage={"decode": 0.0, "target_verify": 1.91}),
        token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: SimpleNamespace(mem_usage=38.2)),
        startup_available_gpu_memory_gb=76.9, max_total_num_tokens=1214336, swa_tokens_per_layer=None,
        spec_algorithm=SimpleNamespace(is_none=lambda: False, is_dspark=lambda: False, is_dflash=lambda: False),
        rust_server=None)


def server(ns, adaptive_cfg=None, graph_bs=None, launch_steps=3, max_running_requests=48, adaptive=None):
    """(worker, internal-state controller) of one scheduler. adaptive_cfg: a config path (None with
    adaptive=True: SGLang's default tiers); graph_bs: the captured CUDA-graph sizes (None: off)."""
    worker = ns.ew.EAGLEWorkerV2(ns.tpw.TpModelWorker(), adaptive_cfg, graph_bs, launch_steps, adaptive)
    ctl = ns.ist.SchedulerInternalStateController(scheduler(worker, max_running_requests), False)
    return worker, ctl


def internal_state(ctl) -> dict:
    """What this scheduler contributes to `/server_info`'s internal_states (SGLang's
    get_internal_state, through the plugin's hook)."""
    return ctl.get_internal_state(SimpleNamespace()).internal_state
