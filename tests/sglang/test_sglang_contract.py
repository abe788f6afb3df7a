"""Contract tests: everything we rely on in sglang 0.5.23 exists in its source (static, via ast).

An SGLang upgrade that renames a hook target, a method argument, an attribute the plugin reads,
a metric, a /server_info or meta_info field, a route, a flag, or the decode log format fails here
with the name that moved. Facts come from the reference notes on SGLang 0.5.23.
"""

from __future__ import annotations

import ast
import re

import pytest

from probes.inserver import sglang_plugin
from probes.inserver.sglang_steps import PIN_KEY, TIMERS_KEY
from sglang_wheel_code import arg_names, methods, module_path, parse, resolve, self_attrs, top_level

EW = "sglang.srt.speculative.eagle_worker_v2"
HTTP = "sglang.srt.entrypoints.http_server"


def _text(src, dotted: str) -> str:
    return module_path(src, dotted).read_text(encoding="utf-8")


_self_attrs = self_attrs


def test_wheel_is_0_5_23(sglang_src):
    assert '0.5.23' in (sglang_src / "version.py").read_text() + (sglang_src / "_version.py").read_text()


@pytest.mark.parametrize("name", sorted(sglang_plugin.TARGETS))
def test_every_hook_target_is_a_function(sglang_src, name):
    node = resolve(sglang_src, sglang_plugin.TARGETS[name])
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), sglang_plugin.TARGETS[name]
    # Not a classmethod/staticmethod: our hooks take self as their first argument.
    decos = {getattr(d, "id", getattr(d, "attr", "")) for d in node.decorator_list}
    assert not decos & {"classmethod", "staticmethod", "property"}


@pytest.mark.parametrize("target, args", [
    (f"{EW}.EAGLEWorkerV2.forward_batch_generation", ["self", "batch"]),
    (f"{EW}.EagleDraftWorker.draft", ["self", "batch"]),
    (f"{EW}.EAGLEWorkerV2.verify", ["self", "batch"]),
    (f"{EW}.EagleDraftWorker._draft_extend_for_decode", ["self", "batch"]),
    (f"{EW}.EAGLEWorkerV2.on_verify_complete_cpu", ["self", "num_correct_drafts_per_req"]),
    ("sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams.get_steps_for_batch",
     ["self", "batch_size"]),
    ("sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams.on_verify_complete",
     ["self", "num_correct_drafts_per_req", "batch_size"]),
    ("sglang.srt.managers.scheduler_components.internal_state."
     "SchedulerInternalStateController._update_handlers", ["self"]),
    ("sglang.srt.entrypoints.http_server.launch_server", ["server_args"]),
])
def test_hooked_signatures_start_as_we_call_them(sglang_src, target, args):
    assert arg_names(resolve(sglang_src, target))[:len(args)] == args


def test_target_forward_takes_is_verify_and_verify_passes_it(sglang_src):
    fn = resolve(sglang_src, sglang_plugin.TARGETS["target_forward"])
    assert "is_verify" in arg_names(fn)
    common = _text(sglang_src, "sglang.srt.speculative.eagle_worker_common")
    assert re.search(r"target_worker\.forward_batch_generation\([^)]*is_verify=True", common, re.S)
    # ... and EAGLEWorkerV2.verify reaches it through run_eagle_verify.
    verify = ast.unparse(resolve(sglang_src, f"{EW}.EAGLEWorkerV2.verify"))
    assert "run_eagle_verify(" in verify


def test_worker_attributes_the_plugin_reads(sglang_src):
    tree = top_level(parse(sglang_src, EW))
    v2 = _self_attrs(tree["EAGLEWorkerV2"])
    for attr in ("speculative_num_steps", "topk", "speculative_num_draft_tokens", "device",
                 "adaptive_controller", "draft_parallel_layout"):
        assert attr in v2, attr
    layout = top_level(parse(sglang_src, "sglang.srt.configs.draft_parallel"))["DraftParallelLayout"]
    assert "local_dp" in methods(layout)
    fbg = ast.unparse(resolve(sglang_src, f"{EW}.EAGLEWorkerV2.forward_batch_generation"))
    # How the plugin tells decode from prefill and reads bs: as SGLang itself does here.
    assert "batch.forward_mode.is_extend()" in fbg and "batch.is_extend_in_batch" in fbg
    assert "batch.seq_lens.shape[0]" in fbg
    # The phases are called from the iteration, so hooks on them nest inside it.
    for call in ("self.draft_worker.draft(batch)", "self.verify(",
                 "self.draft_worker._draft_extend_for_decode("):
        assert call in fbg, call


def test_request_contexts_come_from_host_state(sglang_src):
    # ctx in the plugin's records: `[r.seqlen for r in batch.reqs]`, the batch being the
    # ScheduleBatch that forward_batch_generation receives; seqlen counts host-side id lists.
    fbg = resolve(sglang_src, f"{EW}.EAGLEWorkerV2.forward_batch_generation")
    assert ast.unparse(fbg.args.args[1].annotation) == "ScheduleBatch"
    sb = top_level(parse(sglang_src, "sglang.srt.managers.schedule_batch"))
    fields = {n.target.id for n in sb["ScheduleBatch"].body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert "reqs" in fields
    seqlen = methods(sb["Req"])["seqlen"]
    assert any(ast.unparse(d) == "property" for d in seqlen.decorator_list)
    assert ast.unparse(seqlen.body[-1]) == "return len(self.origin_input_ids) + len(self.output_ids)"


def test_scheduler_feeds_accepted_drafts_and_owns_the_spec_worker(sglang_src):
    brp = _text(sglang_src, "sglang.srt.managers.scheduler_components.batch_result_processor")
    assert "self.model_worker.on_verify_complete_cpu(" in brp
    assert "result.num_correct_drafts_per_req_cpu" in brp
    sched = _text(sglang_src, "sglang.srt.managers.scheduler")
    assert "self.draft_worker = DraftWorkerClass(" in sched
    assert "load_plugins()" in sched and "def run_scheduler_process(" in sched


def test_adaptive_controller_internals_the_pin_uses(sglang_src):
    rt = top_level(parse(sglang_src, "sglang.srt.speculative.adaptive_runtime_state"))
    ctrl = rt["AdaptiveController"]
    assert {"_states", "params", "_activate", "activate_step_by_batch"} <= _self_attrs(ctrl)
    act = ast.unparse(methods(ctrl)["activate_step_by_batch"])
    assert "self.params.get_steps_for_batch(" in act
    ovc = ast.unparse(methods(ctrl)["on_verify_complete"])
    assert "self.params.on_verify_complete(" in ovc
    asp = top_level(parse(sglang_src, "sglang.srt.speculative.adaptive_spec_params"))
    assert "_slots" in _self_attrs(asp["AdaptiveSpeculativeParams"])
    assert {"candidate_steps", "current_steps"} <= _self_attrs(asp["AdaptiveStepSlot"])


def test_set_internal_state_dispatch_we_extend(sglang_src):
    mod = "sglang.srt.managers.scheduler_components.internal_state"
    tree = top_level(parse(sglang_src, mod))
    assert {"UpdateRejected", "_UpdateHandler", "SchedulerInternalStateController"} <= set(tree)
    assert arg_names(methods(tree["_UpdateHandler"])["__init__"]) == ["self", "validate", "apply"]
    body = ast.unparse(methods(tree["SchedulerInternalStateController"])["set_internal_state"])
    assert "self._update_handlers()" in body and "handler.validate(key, value)" in body
    assert "except UpdateRejected" in body and ".apply(key, value) or {}" in body
    assert "scheduler" in _self_attrs(tree["SchedulerInternalStateController"])
    # Our keys must not collide with SGLang's own.
    handlers = ast.unparse(methods(tree["SchedulerInternalStateController"])["_update_handlers"])
    assert PIN_KEY not in handlers and TIMERS_KEY not in handlers
    for key in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        assert f"'{key}'" in handlers
    io = top_level(parse(sglang_src, "sglang.srt.managers.io_struct"))
    assert "Union[int, float]" in ast.unparse(io["SetInternalStateReq"])


def test_plugin_framework_names(sglang_src):
    init = top_level(parse(sglang_src, "sglang.srt.plugins"))
    assert "load_plugins" in init and "GENERAL_PLUGINS_GROUP" in init
    assert '"sglang.srt.plugins"' in _text(sglang_src, "sglang.srt.plugins")
    hr = top_level(parse(sglang_src, "sglang.srt.plugins.hook_registry"))
    assert {"AROUND", "REPLACE", "BEFORE", "AFTER"} <= set(top_level(ast.Module(
        body=hr["HookType"].body, type_ignores=[])))
    assert "SGLANG_PLUGINS" in _text(sglang_src, "sglang.srt.environ")
    assert "load_plugins()" in _text(sglang_src, "sglang.launch_server")


def test_spans_sglang_emits_and_the_one_it_does_not(sglang_src):
    ew = _text(sglang_src, EW)
    assert 'spec_stage_span("draft")' in ew and 'spec_stage_span("draft_extend")' in ew
    # No verify span: the plugin's specdecode.verify is what gives traces an explicit verify range.
    assert 'spec_stage_span("verify")' not in ew
    assert "torch.autograd._profiler_enabled()" in _text(sglang_src, "sglang.srt.utils.nvtx_utils")


def test_metrics_route_is_mounted_over_the_multiprocess_collector(sglang_src):
    fn = ast.unparse(resolve(sglang_src, "sglang.srt.utils.common.add_prometheus_middleware"))
    assert "MultiProcessCollector" in fn and "app.routes.append" in fn
    http = _text(sglang_src, "sglang.srt.entrypoints.http_server")
    assert "add_prometheus_middleware(app)" in http
    assert "from sglang.srt.utils import (\n    add_prometheus_middleware," in http
    assert 'os.environ["PROMETHEUS_MULTIPROC_DIR"]' in _text(sglang_src, "sglang.srt.utils.common")


def test_http_launch_hook_is_at_the_file_and_line_the_plugin_names(sglang_src):
    """The HTTP-process hook target, named with file:line in the plugin's docstring. An SGLang
    upgrade that moves or renames it fails here: update HTTP_LAUNCH_AT and the docstring."""
    where = sglang_plugin.HTTP_LAUNCH_AT
    assert where in sglang_plugin.__doc__
    path, line = where.rsplit(":", 1)
    assert sglang_plugin.TARGETS["http_launch"] == f"{HTTP}.launch_server"
    assert module_path(sglang_src, HTTP).relative_to(sglang_src.parent).as_posix() == path
    node = resolve(sglang_src, sglang_plugin.TARGETS["http_launch"])
    assert isinstance(node, ast.FunctionDef) and node.lineno == int(line)


def test_http_launch_runs_after_load_plugins_whatever_the_flags(sglang_src):
    # `python -m sglang.launch_server` and `sglang serve` both load plugins, then import
    # launch_server at call time (so they get the hooked one) in the default HTTP mode.
    ls = _text(sglang_src, "sglang.launch_server")
    assert "    load_plugins()\n\n    server_args = prepare_server_args(sys.argv[1:])" in ls
    assert "        from sglang.srt.entrypoints.http_server import launch_server\n\n" \
           "        launch_server(server_args)" in ls
    serve = _text(sglang_src, "sglang.cli.serve")
    assert "from sglang.launch_server import run_server" in serve and "load_plugins()" in serve
    # ... while SGLang mounts /metrics only with --enable-metrics: why the routes left that hook.
    assert "    if get_observability().enable_metrics:\n        add_prometheus_middleware(app)" \
           in _text(sglang_src, HTTP)


def test_http_launch_starts_the_schedulers_after_our_hook_as_spawned_children(sglang_src):
    """What the hook puts into os.environ reaches every rank: the body starts the schedulers
    (spawned processes, which copy the environment), then serves the module's `app`."""
    fn = resolve(sglang_src, f"{HTTP}.launch_server")
    body = ast.unparse(fn)
    start, serve = body.index("Engine._launch_subprocesses("), body.index("_setup_and_run_http_server(")
    assert start < serve
    # the launch is not behind a flag: the statement right after the docstring
    assert "Engine._launch_subprocesses(" in ast.unparse(fn.body[1])
    engine = _text(sglang_src, "sglang.srt.entrypoints.engine")
    assert 'mp.set_start_method("spawn", force=True)' in engine and "mp.Process(" in engine
    assert "app" in top_level(parse(sglang_src, HTTP))       # the FastAPI object we add routes to
    setup = ast.unparse(resolve(sglang_src, f"{HTTP}._setup_and_run_http_server"))
    assert "uvicorn.Config(app, host=" in setup             # one worker serves that very object


def test_more_tokenizer_workers_import_the_app_path_we_set(sglang_src):
    """With --tokenizer-worker-num > 1 the HTTP workers import SGLANG_HTTP_SERVER_APP_PATH afresh
    and nothing there loads plugins: the launch hook points the variable at our app module, and
    SGLang reads it from os.environ when it starts the workers, after the hook ran."""
    env = _text(sglang_src, "sglang.srt.environ")
    assert f'{sglang_plugin.APP_PATH_ENV} = EnvStr("{sglang_plugin.SGLANG_APP}")' in env
    assert "        value = os.getenv(self.name)" in env          # EnvField.get reads it live
    setup = ast.unparse(resolve(sglang_src, f"{HTTP}._setup_and_run_http_server"))
    assert "app_path = envs.SGLANG_HTTP_SERVER_APP_PATH.get()" in setup
    assert "uvicorn.run(app_path, **uvicorn_options)" in setup
    assert "'workers': get_serving().tokenizer_worker_num" in setup
    granian = ast.unparse(resolve(sglang_src, f"{HTTP}._run_granian_server"))
    assert "envs.SGLANG_HTTP_SERVER_APP_PATH.get()" in granian
    for mod in (HTTP, "sglang.srt.managers.multi_tokenizer_mixin"):
        assert "load_plugins" not in _text(sglang_src, mod), mod


SCHEDULER_METRICS = ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
                     "sglang:token_usage", "sglang:spec_accept_length", "sglang:spec_accept_rate",
                     "sglang:spec_num_steps", "sglang:spec_num_draft_tokens",
                     "sglang:realtime_tokens_total", "sglang:forward_execution_seconds_total",
                     "sglang:generation_tokens_total", "sglang:spec_verify_calls_total",
                     "sglang:prompt_tokens_total", "sglang:e2e_request_latency_seconds",
                     "sglang:time_to_first_token_seconds"]


@pytest.mark.parametrize("name", SCHEDULER_METRICS)
def test_metric_names(sglang_src, name):
    assert f'name="{name}"' in _text(sglang_src, "sglang.srt.observability.metrics_collector")


def test_metric_labels_and_device_timer_categories(sglang_src):
    mc = _text(sglang_src, "sglang.srt.observability.metrics_collector")
    for label in ('"tp_rank": parallel.tp_rank', '"model_name"', '"engine_type"'):
        assert label in mc
    assert 'labelnames=list(labels.keys()) + ["category"]' in mc
    assert 'labelnames=list(labels.keys()) + ["mode"]' in mc
    runner = _text(sglang_src, "sglang.srt.speculative.eagle_draft_cuda_graph_runner")
    assert '"eagle_draft"' in runner
    assert '"eagle_draft_extend"' in _text(sglang_src,
                                          "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner")
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER" in _text(sglang_src, "sglang.srt.environ")


@pytest.mark.parametrize("key", ["spec_verify_ct", "spec_accept_length", "spec_accept_rate",
                                 "spec_num_correct_drafts", "spec_num_proposed_drafts",
                                 "spec_correct_drafts_histogram", "e2e_latency",
                                 "completion_tokens", "prompt_tokens", "finish_reason"])
def test_generate_meta_info_keys(sglang_src, key):
    assert f'"{key}"' in _text(sglang_src, "sglang.srt.managers.tokenizer_manager")


def test_server_info_shape(sglang_src):
    http = _text(sglang_src, "sglang.srt.entrypoints.http_server")
    for route in ('"/server_info"', '"/get_server_info"', '"/model_info"', '"/health"',
                  '"/set_internal_state"', '"/start_profile"', '"/stop_profile"', '"/flush_cache"',
                  '"/generate"'):
        assert route in http, route
    assert '"internal_states"' in http and '"version"' in http
    ist = _text(sglang_src, "sglang.srt.managers.scheduler_components.internal_state")
    for key in ('"avg_spec_accept_length"', '"last_gen_throughput"', '"memory_usage"', '"world_size"',
                "resolved_server_args_dict()"):
        assert key in ist, key
    # The active adaptive tier reaches internal_states through this override.
    assert 'get_context().override(\n            "adaptive_spec.restore"' in _text(sglang_src, EW)
    assert "launch_command" in _text(sglang_src, "sglang.srt.server_args")


@pytest.mark.parametrize("field", ["speculative_algorithm", "speculative_draft_model_path",
                                   "speculative_num_steps", "speculative_eagle_topk",
                                   "speculative_num_draft_tokens", "speculative_adaptive",
                                   "speculative_adaptive_config"])
def test_spec_server_args(sglang_src, field):
    spec = top_level(parse(sglang_src, "sglang.srt.arg_groups.fields.spec"))["Spec"]
    assert field in {n.target.id for n in spec.body if isinstance(n, ast.AnnAssign)}


def test_other_flags_and_env_we_document(sglang_src):
    obs = _text(sglang_src, "sglang.srt.arg_groups.fields.observability")
    assert "enable_metrics:" in obs and "decode_log_interval:" in obs
    assert "enable_metrics_for_all_schedulers:" in obs
    env = _text(sglang_src, "sglang.srt.environ")
    for var in ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLANG_SIMULATE_ACC_LEN",
                "SGLANG_TORCH_PROFILER_DIR"):
        assert var in env or var in _text(sglang_src, "sglang.srt.managers.scheduler_components.profiler_manager"), var


def test_decode_log_line_pieces(sglang_src):
    mr = _text(sglang_src, "sglang.srt.managers.scheduler_components.metrics_reporter")
    for piece in ('f"Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"',
                  'f"accept len: {spec_accept_length:.2f}, accept rate: {spec_accept_rate:.2f}, "',
                  'f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "',
                  "f\"#queue-req: {len(self.scheduler.waiting_queue)}\""):
        assert piece in mr, piece
    pool = _text(sglang_src, "sglang.srt.managers.scheduler_components.pool_stats_observer")
    assert 'f"#token: {self.full_num_used}, token usage: {self.full_token_usage:.2f}"' in pool
    common = _text(sglang_src, "sglang.srt.utils.common")
    assert 'format = f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"' in common
    assert 'datefmt="%Y-%m-%d %H:%M:%S"' in common


def test_profile_trace_file_naming(sglang_src):
    pm = _text(sglang_src, "sglang.srt.managers.scheduler_components.profiler_manager")
    assert "-TP-" in pm and ".trace.json.gz" in pm
