"""specdecode-tune's SGLang 0.5.23 plugin: phase timers, a phase stream, and a live step pin.

Loaded by SGLang's `load_plugins()` through our distribution's entry point `specdecode` in group
`sglang.srt.plugins` (select it with SGLANG_PLUGINS=specdecode when several are installed).
`register()` runs in every SGLang process and registers AROUND hooks with SGLang's HookRegistry:

scheduler (TP rank) processes
  EAGLEWorkerV2.forward_batch_generation   one decode iteration (wall, bs, active config, each
                                           request's context length from host-side state)
  EagleDraftWorker.draft                   phase `draft`
  EAGLEWorkerV2.verify                     `verify` + `verify_sample`; `specdecode.verify` span
  TpModelWorker.forward_batch_generation   the target forward inside verify (`verify`); after it,
                                           a `specdecode.verify_sample` span until verify returns
  EagleDraftWorker._draft_extend_for_decode  phase `draft_extend`
  EAGLEWorkerV2.on_verify_complete_cpu     accepted drafts per request (already on the host)
  SchedulerInternalStateController._update_handlers   adds `specdecode_num_steps`, `specdecode_timers`
  SchedulerInternalStateController.get_internal_state adds `specdecode_pinnable_steps` (what can be
                                           pinned, at which batch sizes: sglang_steps.pinnable_info),
                                           `specdecode_allreduce` (the tp group's all-reduce path
                                           per decode size) and `specdecode_collectives` (per
                                           forward, computed: sglang_comm)
  AdaptiveSpeculativeParams.get_steps_for_batch / .on_verify_complete   obey the pin where the
                                           batch size's slot has graphs for its tier
main (HTTP) process
  http_server.launch_server                before SGLang starts its schedulers: picks the phase-stream
                                           directory (SPECDECODE_STREAM_DIR, inherited by every
                                           rank) and adds GET /specdecode/phases and
                                           /specdecode/streams to SGLang's FastAPI `app`

The HTTP hook is `launch_server` at sglang/srt/entrypoints/http_server.py:3125 (0.5.23; HTTP_LAUNCH_AT),
what `python -m sglang.launch_server` and `sglang serve` run in the launching process after
`load_plugins()`, whatever the flags: the routes no longer need `--enable-metrics` (SGLang calls
`add_prometheus_middleware` only with it). Not covered: `--use-ray` and encoder-only servers (other
launch functions), and `sglang.Engine` without HTTP (no routes; the stream still goes to
PROMETHEUS_MULTIPROC_DIR with metrics on, or to a SPECDECODE_STREAM_DIR the user sets). SGLang's
registry imports a target's module when `load_plugins()` applies the hooks, so http_server.py is
imported in the launching process before the server args are parsed; the settings it reads at
import come from the user's environment either way.

More than one tokenizer worker (`--tokenizer-worker-num N`, N > 1): SGLang's HTTP workers are
fresh processes that import the app named by SGLANG_HTTP_SERVER_APP_PATH and never call
`load_plugins()`. The launch hook points that variable at `probes.inserver.sglang_app:app`
(SGLang's app plus the routes), so every worker serves `/specdecode/*` over the same stream
directory. If you set SGLANG_HTTP_SERVER_APP_PATH yourself it is left alone and the workers have no
`/specdecode/*` (404); the scheduler side works either way: the timer lease and the step pin through
`/set_internal_state`, the `/metrics` counters (with `--enable-metrics`), and the stream files.

Timing records CUDA events on the current stream and never synchronizes: records are resolved a
few iterations later (sglang_timing). Timers run only while someone holds a lease
(`/set_internal_state {"server_args": {"specdecode_timers": SECONDS}}`) or with
SPECDECODE_TIMERS=always; otherwise each hook costs one flag check. Hooks pass through during
CUDA-graph capture. Nothing here may raise into SGLang's loop: a failing probe turns itself off.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from probes.names import ALLREDUCE_PATHS, COLLECTIVES, SHARDED
from probes.inserver.sglang_steps import (
    PIN_KEY, PINNABLE_KEY, TIMERS_KEY, Lease, Refused, StepPin, adaptive_view, check_lease, check_pin,
    coverage_of, pin_holds, pinnable_info,
)
from probes.inserver.sglang_stream import (
    MAX_LIMIT, STREAM_ENV, RingWriter, choose_stream_dir, list_streams, read_records, stream_dir,
)
from probes.inserver.sglang_timing import HostEvent, PhaseTimeline

PLUGIN_VERSION = "2"          # 2: publishes the pinnable steps; the pin yields where a tier has no graphs
log = logging.getLogger("specdecode.sglang_plugin")

_EW = "sglang.srt.speculative.eagle_worker_v2"
# Every dotted path and attribute used here is checked against the wheel by tests/sglang.
TARGETS = {
    "iteration": f"{_EW}.EAGLEWorkerV2.forward_batch_generation",
    "draft": f"{_EW}.EagleDraftWorker.draft",
    "verify": f"{_EW}.EAGLEWorkerV2.verify",
    "target_forward": "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
    "draft_extend": f"{_EW}.EagleDraftWorker._draft_extend_for_decode",
    "accepted": f"{_EW}.EAGLEWorkerV2.on_verify_complete_cpu",
    "update_handlers": "sglang.srt.managers.scheduler_components.internal_state."
                       "SchedulerInternalStateController._update_handlers",
    "internal_state": "sglang.srt.managers.scheduler_components.internal_state."
                      "SchedulerInternalStateController.get_internal_state",
    "policy_steps": "sglang.srt.speculative.adaptive_spec_params."
                    "AdaptiveSpeculativeParams.get_steps_for_batch",
    "policy_feedback": "sglang.srt.speculative.adaptive_spec_params."
                       "AdaptiveSpeculativeParams.on_verify_complete",
    "http_launch": "sglang.srt.entrypoints.http_server.launch_server",
}
HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
APP_PATH_ENV = "SGLANG_HTTP_SERVER_APP_PATH"        # what SGLang's extra HTTP workers import
SGLANG_APP = f"{HTTP_SERVER_MODULE}:app"            # its default (checked by the contract tests)
WORKER_APP = "probes.inserver.sglang_app:app"       # the same app with our routes
HTTP_LAUNCH_AT = "sglang/srt/entrypoints/http_server.py:3125"   # checked by the contract tests
SCHEDULER_HOOKS = ("iteration", "draft", "verify", "target_forward", "draft_extend", "accepted",
                   "update_handlers", "internal_state", "policy_steps", "policy_feedback")
MAIN_HOOKS = ("http_launch",)
INTERNAL_STATE_MODULE = "sglang.srt.managers.scheduler_components.internal_state"
FLUSH_EVERY_S = 0.2                          # stream/counter latency vs per-iteration cost
FLUSH_MAX_RECORDS = 256
VERIFY_SPAN = "specdecode.verify"            # the whole EAGLEWorkerV2.verify call
SAMPLE_SPAN = "specdecode.verify_sample"     # from the end of the target forward to verify's end


class _Probe:
    """Per-process state of the plugin inside one scheduler."""

    def __init__(self) -> None:
        always = os.environ.get("SPECDECODE_TIMERS", "").lower() in ("always", "1", "on")
        self.lease = Lease(always=always)
        self.pin = StepPin()
        self.timeline: PhaseTimeline | None = None
        self.writer: RingWriter | None = None
        self.metrics: Any = None
        self.broken: str | None = None      # set once a probe failed; timing stays off
        self.outbox: list[dict] = []         # finished records not yet written
        self.flushed_at = 0.0
        self.in_verify = False
        self.sample_span: Any = None         # open specdecode.verify_sample record_function
        self.profiler_enabled: Callable[[], bool] = _profiler_enabled_lazy
        self.capturing: Callable[[], bool] = lambda: False
        self.pinnable: tuple[Any, Any] = (None, None)    # (controller id, max bs) -> published info
        self.comm: tuple[Any, Any] | None = None          # (all-reduce paths, collectives), once

    def open_sample_span(self) -> None:
        import torch

        self.close_sample_span()
        rf = torch.profiler.record_function(SAMPLE_SPAN)
        rf.__enter__()
        self.sample_span = rf

    def close_sample_span(self) -> None:
        rf, self.sample_span = self.sample_span, None
        if rf is not None:
            rf.__exit__(None, None, None)

    def timing(self) -> bool:
        return self.broken is None and self.lease.on(time.monotonic())

    def fail(self, what: str, exc: BaseException) -> None:
        self.broken = f"{what}: {type(exc).__name__}: {exc}"
        log.warning("specdecode plugin: phase timers off (%s)", self.broken)

    def start(self, worker: Any) -> None:
        """Lazy set-up on the first timed iteration, inside the scheduler process."""
        import torch

        self.profiler_enabled = torch.autograd._profiler_enabled
        dev = str(getattr(worker, "device", "cuda"))
        cuda = dev.startswith("cuda") and torch.cuda.is_available()
        self.capturing = torch.cuda.is_current_stream_capturing if cuda else (lambda: False)
        make = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else HostEvent
        dp, rank = _ranks()
        self.timeline = PhaseTimeline(make, rank=rank)
        self.flushed_at = time.monotonic()
        d = stream_dir()
        if d is not None:
            self.writer = RingWriter(d, dp, rank)
            if self.writer.error:
                log.warning("specdecode plugin: %s", self.writer.error)
        try:
            from probes.inserver.sglang_metrics import PhaseMetrics

            self.metrics = PhaseMetrics(rank)
            self.metrics.set_rank_info(_pci_bus_id(torch, dev) if cuda else None, None, *_node())
        except Exception as e:           # prometheus_client missing: the stream still works
            log.warning("specdecode plugin: no /metrics counters (%s)", e)
            self.metrics = None

    def flush(self, force: bool = False) -> None:
        """Move finished records out: to the stream file and the counters, in batches (one write
        and a handful of counter updates every FLUSH_EVERY_S, not per iteration)."""
        if self.timeline is None:
            return
        self.outbox.extend(self.timeline.poll())
        now = time.monotonic()
        if not self.outbox or (not force and now - self.flushed_at < FLUSH_EVERY_S
                               and len(self.outbox) < FLUSH_MAX_RECORDS):
            return
        records, self.outbox, self.flushed_at = self.outbox, [], now
        if self.writer is not None:
            self.writer.write(records)
        if self.metrics is not None:
            self.metrics.add(records)


def _profiler_enabled_lazy() -> bool:
    # Spans must appear in traces even when no timer lease was ever granted.
    import torch

    _probe.profiler_enabled = torch.autograd._profiler_enabled
    return bool(torch.autograd._profiler_enabled())


_probe = _Probe()


def _ranks() -> tuple[int, int]:
    """(dp rank, tp rank) of this scheduler; SGLang's context, else torch.distributed."""
    dp = rank = None
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        rank = int(par.tp_rank)
        try:
            dp = int(par.dp_rank or 0)
        except Exception:
            dp = 0
    except Exception:
        pass
    if rank is None:
        try:
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_initialized() else 0
        except Exception:
            rank = 0
    return int(dp or 0), int(rank)


def _node() -> tuple[str, str]:
    """(dist_init_addr, node_rank) of a multi-node launch from SGLang's parallel context; ("", "") on
    one node or when SGLang does not say. The address is the same on every node of one model, so the
    fleet matches a follower node's rank_info to its leader's by it."""
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        if int(par.nnodes or 1) <= 1:
            return "", ""
        return str(par.dist_init_addr or ""), str(int(par.node_rank or 0))
    except Exception:
        return "", ""


def _pci_bus_id(torch: Any, dev: str) -> str | None:
    try:
        idx = torch.device(dev).index
        p = torch.cuda.get_device_properties(torch.cuda.current_device() if idx is None else idx)
        return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
    except Exception:
        return None


def _is_decode(batch: Any) -> bool:
    try:
        return not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
    except Exception:
        return False


# --- scheduler hooks ----------------------------------------------------------------------------

def around_iteration(original: Callable, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    p = _probe
    if not p.timing() or not _is_decode(batch):
        if p.timeline is not None and (p.timeline.pending or p.outbox):
            p.flush(force=True)              # resolve what is left from the last lease
        return original(self, batch, *args, **kwargs)
    try:
        if p.timeline is None:
            p.start(self)
        if p.capturing():
            return original(self, batch, *args, **kwargs)
        p.flush()
        assert p.timeline is not None
        p.timeline.begin(bs=int(batch.seq_lens.shape[0]), steps=int(self.speculative_num_steps),
                         topk=int(self.topk), num_draft_tokens=int(self.speculative_num_draft_tokens),
                         placement=_placement(self), ctx=_contexts(batch),
                         controller=(ctrl := getattr(self, "adaptive_controller", None)) is not None,
                         # the policy hook, called inside the original, says what this batch ran
                         adaptive=ctrl is not None and not p.pin.pinned,
                         pinned=p.pin.pinned if ctrl is not None and p.pin.pinned else None,
                         simulated=bool(os.environ.get("SGLANG_SIMULATE_ACC_LEN")))
    except Exception as e:
        p.fail("iteration start", e)
        return original(self, batch, *args, **kwargs)
    try:
        out = original(self, batch, *args, **kwargs)
    except BaseException:
        p.timeline.abandon()
        raise
    p.timeline.end()
    return out


def _contexts(batch: Any) -> list[int] | None:
    """Each request's context length, in batch order, from the scheduler's host-side request state
    (`Req.seqlen`: prompt plus output ids; under overlap it lags the device by one verify, well
    inside a context bucket). Never a device read: `batch.seq_lens` lives on the GPU."""
    try:
        return [int(r.seqlen) for r in batch.reqs]
    except Exception:
        return None


def _placement(worker: Any) -> str:
    # SGLang has no placement knob: the draft shares the target's TP group unless attention-DP
    # gives it the attention-TP group (reference §4.2).
    layout = getattr(worker, "draft_parallel_layout", None)
    return "attn_tp" if getattr(layout, "local_dp", False) else SHARDED


def _phase_hook(mark: str, span: str | None = None) -> Callable:
    def hook(original: Callable, *args: Any, **kwargs: Any) -> Any:
        p = _probe
        tl = p.timeline
        timed = tl is not None and tl.active and not p.capturing()
        spanned = span is not None and p.profiler_enabled()
        if not timed and not spanned:
            return original(*args, **kwargs)
        handle = tl.open(mark) if timed else -1
        verify = mark == "verify_all"
        if verify:
            p.in_verify = True
        try:
            if spanned:
                import torch

                with torch.profiler.record_function(span):
                    try:
                        return original(*args, **kwargs)
                    finally:
                        if verify:
                            p.close_sample_span()     # nested inside specdecode.verify
            return original(*args, **kwargs)
        finally:
            if verify:
                p.in_verify = False
            if timed:
                tl.close(handle)

    hook.__name__ = f"specdecode_{mark}"
    return hook


around_draft = _phase_hook("draft")
around_verify = _phase_hook("verify_all", VERIFY_SPAN)
around_draft_extend = _phase_hook("draft_extend")
_around_target = _phase_hook("target_verify")


def around_target_forward(original: Callable, *args: Any, **kwargs: Any) -> Any:
    # TpModelWorker.forward_batch_generation also runs prefill and plain decode: time only the
    # verify forward inside EAGLEWorkerV2.verify.
    p = _probe
    if not (p.in_verify and kwargs.get("is_verify")):
        return original(*args, **kwargs)
    out = _around_target(original, *args, **kwargs)
    if p.profiler_enabled():
        p.open_sample_span()
    return out


def around_accepted(original: Callable, self: Any, num_correct_drafts_per_req: Any,
                    *args: Any, **kwargs: Any) -> Any:
    tl = _probe.timeline
    if tl is not None and tl.pending:
        try:
            tl.accepted(list(num_correct_drafts_per_req))
        except Exception as e:
            _probe.fail("accepted drafts", e)
    return original(self, num_correct_drafts_per_req, *args, **kwargs)


def around_policy_steps(original: Callable, self: Any, batch_size: int) -> int:
    # Called by activate_step_by_batch at the start of each decode iteration (eagle_worker_v2.py:
    # 1445), inside around_iteration: the record takes the tier this batch really runs (the tier
    # read before the switch would be the previous batch's).
    policy = original(self, batch_size)
    p = _probe
    try:
        cands = self._route(batch_size).candidate_steps if p.pin.pinned else ()
    except Exception:
        cands = ()
    steps = p.pin.steps_for_batch(policy, cands)
    tl = p.timeline
    if tl is not None and tl.active:
        pinned = p.pin.held if p.pin.pinned else None
        tl.update(steps=int(steps), num_draft_tokens=int(steps) + 1, adaptive=not p.pin.held, pinned=pinned)
    return steps


def around_policy_feedback(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
    # Where the pin holds the policy must not move the tier (nor its EMA: it would resume from a
    # state measured at a tier it did not choose). Where it does not (no graphs for the pinned tier
    # at this batch size), SGLang's policy runs, so it keeps learning from what it ran.
    pin = _probe.pin
    if not pin.pinned:
        return original(self, *args, **kwargs)
    bs = kwargs.get("batch_size", args[1] if len(args) > 1 else None)
    try:
        cands = self._route(int(bs)).candidate_steps
    except Exception:
        return None
    if pin_holds(pin.steps, pin.launch, pin.graphs, cands):  # type: ignore[arg-type]
        return None
    return original(self, *args, **kwargs)


def around_update_handlers(original: Callable, self: Any, *args: Any, **kwargs: Any) -> dict:
    handlers = original(self, *args, **kwargs)
    mod = sys.modules[INTERNAL_STATE_MODULE]
    rejected, handler = mod.UpdateRejected, mod._UpdateHandler
    scheduler = self.scheduler

    def validate_pin(key: str, value: Any) -> None:
        try:
            check_pin(value, *_pin_context(scheduler)[1:])
        except Refused as e:
            raise rejected(str(e)) from None

    def apply_pin(key: str, value: Any) -> None:
        ctrl, view, cover = _pin_context(scheduler)
        n = check_pin(value, view, cover)
        pin = _probe.pin
        pin.steps = n
        if view is not None:
            pin.launch, pin.graphs = view.launch, view.graph_bs is not None
        if n is not None:
            ctrl._activate(n)            # swap now; get_steps_for_batch keeps it where it holds
        if _probe.timeline is not None:
            _probe.timeline.operator_change()   # a pin is the operator's change: a new epoch
        where = ""
        if n is not None and cover is not None and view is not None:
            from probes.sglang_tiers import everywhere, ranges_text
            if not everywhere(cover[n], _max_bs(scheduler)):
                where = f" at {ranges_text(cover[n])} only (SGLang's policy elsewhere: no graphs there)"
        log.info("specdecode plugin: %s", f"steps pinned to {n}{where}" if n is not None
                 else "step pin released to SGLang's adaptive policy")

    def validate_timers(key: str, value: Any) -> None:
        try:
            check_lease(value)
        except Refused as e:
            raise rejected(str(e)) from None
        if _probe.broken:
            raise rejected(f"specdecode phase timers are off in this process: {_probe.broken}")

    def apply_timers(key: str, value: Any) -> None:
        _probe.lease.grant(check_lease(value), time.monotonic())

    # apply returns None: these are plugin commands, not server args for SGLang's override.
    handlers[PIN_KEY] = handler(validate_pin, apply_pin)
    handlers[TIMERS_KEY] = handler(validate_timers, apply_timers)
    return handlers


def _controller(scheduler: Any) -> Any:
    return getattr(getattr(scheduler, "draft_worker", None), "adaptive_controller", None)


def _max_bs(scheduler: Any) -> int:
    # Slots above the scheduler's request cap never run (internal_state.py:73 publishes the same).
    return int(getattr(scheduler, "max_running_requests", 0) or 0)


def _pin_context(scheduler: Any) -> tuple[Any, Any, Any]:
    """(controller, its view, tier coverage over the batch sizes this scheduler runs)."""
    ctrl = _controller(scheduler)
    view = adaptive_view(ctrl)
    max_bs = _max_bs(scheduler)
    if view is None or max_bs < 1:
        return ctrl, view, None
    return ctrl, view, coverage_of(view, max_bs, lambda bs: ctrl.params._route(bs).candidate_steps)


def _comm_info(scheduler: Any) -> tuple[dict | None, dict | None]:
    """(the tp group's all-reduce paths, collectives per forward), computed once per process."""
    import torch
    from sglang.srt.distributed.parallel_state import get_tp_group

    from probes.inserver.sglang_comm import allreduce_report, collectives_per_forward

    worker = getattr(scheduler, "draft_worker", None)
    runner = scheduler.tp_worker.model_runner
    group = get_tp_group()
    hidden = int(runner.model_config.hidden_size)
    graph = getattr(runner, "decode_cuda_graph_runner", None)
    sizes = list(getattr(graph, "capture_bs", None) or [])
    n = int(getattr(worker, "speculative_num_draft_tokens", 1) or 1)
    device = getattr(runner, "device", "cuda")
    biggest: list[Any] = []

    def probe(rows: int) -> Any:
        # one allocation at the largest size, views after it (the paths only read shape and dtype)
        if not biggest:
            biggest.append(torch.empty((max(sizes) * n, hidden), dtype=torch.bfloat16, device=device))
        return biggest[0][:rows]

    ca = getattr(group, "ca_comm", None)
    env = os.environ.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "").lower() in ("1", "true", "yes")
    paths = allreduce_report(group, hidden, sizes, n, probe, full_nvlink=getattr(ca, "full_nvlink", None),
                             env_pcie_ipc=env,
                             deterministic=bool(getattr(scheduler.server_args, "enable_deterministic_inference", False)))
    draft_model = getattr(getattr(getattr(worker, "draft_worker", None), "draft_runner", None), "model", None)
    counts = {"target_forward": collectives_per_forward(runner.model), "tp_size": int(group.world_size),
              "source": "computed from the module trees"}
    if draft_model is not None:
        counts["draft_forward"] = collectives_per_forward(draft_model)
    return paths, counts


def around_get_internal_state(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(self, *args, **kwargs)
    try:
        if _probe.comm is None:
            _probe.comm = _comm_info(self.scheduler)
        paths, counts = _probe.comm
        if paths is not None:
            out.internal_state[ALLREDUCE_PATHS] = paths
        if counts is not None:
            out.internal_state[COLLECTIVES] = counts
    except Exception as e:                  # never break SGLang's /server_info
        _probe.comm = (None, None)
        log.warning("specdecode plugin: no all-reduce report in /server_info (%s: %s)", type(e).__name__, e)
    try:
        scheduler = self.scheduler
        ctrl = _controller(scheduler)
        key = (id(ctrl), _max_bs(scheduler))
        if _probe.pinnable[0] != key:       # slots never change after startup: compute once
            info = pinnable_info(adaptive_view(ctrl), key[1],
                                 lambda bs: ctrl.params._route(bs).candidate_steps) if key[1] > 0 else None
            _probe.pinnable = (key, info)
        if _probe.pinnable[1] is not None:
            out.internal_state[PINNABLE_KEY] = _probe.pinnable[1]
    except Exception as e:                  # never break SGLang's /server_info
        log.warning("specdecode plugin: no %s in /server_info (%s: %s)", PINNABLE_KEY, type(e).__name__, e)
    return out


# --- HTTP process: the stream route -------------------------------------------------------------

def _query_int(params: Any, name: str, default: int, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    v = int(raw)                          # ValueError -> 400 below
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def phases_reply(params: Any, directory: Path | None) -> tuple[int, dict]:
    """(status, body) of GET /specdecode/phases; pure over a query mapping and the stream dir."""
    if directory is None:
        return 404, {"error": {"message": f"no phase stream: {STREAM_ENV} is not set in the server "
                               "(the plugin's launch hook sets it; set it yourself if the log says "
                               "it could not)",
                               "type": "not_found", "code": 404}}
    try:
        after = _query_int(params, "after", 0, 0, 2**62)
        limit = _query_int(params, "limit", 1024, 1, MAX_LIMIT)
        rank = _query_int(params, "rank", 0, 0, 1 << 16)
        dp = _query_int(params, "dp", 0, 0, 1 << 16)
    except ValueError as e:
        return 400, {"error": {"message": f"bad query: {e}", "type": "invalid_request", "code": 400}}
    return 200, read_records(directory, dp=dp, rank=rank, after=after, limit=limit)


def streams_reply(directory: Path | None) -> dict:
    return {"plugin": "specdecode", "version": PLUGIN_VERSION,
            "streams": list_streams(directory) if directory is not None else []}


ROUTES = ("/specdecode/phases", "/specdecode/streams")


def install_routes(app: Any) -> None:
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if any(getattr(r, "path", None) in ROUTES for r in app.router.routes):
        return                            # a second launch in one process: keep one copy

    # Plain (sync) endpoints: Starlette runs them in its thread pool, off SGLang's event loop.
    def phases(request: Any) -> Any:
        status, body = phases_reply(request.query_params, stream_dir())
        return JSONResponse(body, status_code=status)

    def streams(request: Any) -> Any:
        return JSONResponse(streams_reply(stream_dir()))

    app.router.routes.append(Route(ROUTES[0], phases, methods=["GET"]))
    app.router.routes.append(Route(ROUTES[1], streams, methods=["GET"]))


def around_launch_server(original: Callable, *args: Any, **kwargs: Any) -> Any:
    # Runs before SGLang's own body, i.e. before Engine._launch_subprocesses starts the schedulers
    # (the contract tests pin that order): what is put into os.environ here reaches every rank.
    try:
        d, made = choose_stream_dir()
        log.info("specdecode plugin: phase stream in %s (%s)", d,
                 "made for this launch" if made else f"from {STREAM_ENV}")
    except Exception as e:                # no temp dir: ranks fall back to PROMETHEUS_MULTIPROC_DIR
        log.warning("specdecode plugin: no phase stream directory (%s)", e)
    try:
        # Routes go on the module's app: single-worker servers serve this object itself.
        install_routes(sys.modules[HTTP_SERVER_MODULE].app)
    except Exception as e:
        log.warning("specdecode plugin: no /specdecode routes (%s)", e)
    # Extra HTTP workers (--tokenizer-worker-num > 1) import an app path instead; SGLang reads it
    # from the environment when it starts them, after this hook.
    app_path = os.environ.get(APP_PATH_ENV) or SGLANG_APP
    if app_path == SGLANG_APP:
        os.environ[APP_PATH_ENV] = WORKER_APP
    else:
        log.info("specdecode plugin: %s=%s is yours: extra HTTP workers get no /specdecode routes",
                 APP_PATH_ENV, app_path)
    return original(*args, **kwargs)


HOOKS: dict[str, Callable] = {
    "iteration": around_iteration,
    "draft": around_draft,
    "verify": around_verify,
    "target_forward": around_target_forward,
    "draft_extend": around_draft_extend,
    "accepted": around_accepted,
    "update_handlers": around_update_handlers,
    "internal_state": around_get_internal_state,
    "policy_steps": around_policy_steps,
    "policy_feedback": around_policy_feedback,
    "http_launch": around_launch_server,
}


def process_role() -> str:
    """Which SGLang process is loading plugins: `scheduler`, `main`, or `other`.

    Hook targets are imported by SGLang in every process that registers them, so each process
    registers only what runs there. SPECDECODE_PLUGIN_ROLE overrides the guess.
    """
    forced = os.environ.get("SPECDECODE_PLUGIN_ROLE")
    if forced in ("scheduler", "main", "other", "all"):
        return forced
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_name
        if name == "run_scheduler_process":
            return "scheduler"
        if name in ("run_detokenizer_process", "run_data_parallel_controller_process"):
            return "other"
        f = f.f_back
    return "main"


def register() -> None:
    """Entry point called by sglang.srt.plugins.load_plugins() in every SGLang process."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    role = process_role()
    names = {"scheduler": SCHEDULER_HOOKS, "main": MAIN_HOOKS, "other": (),
             "all": SCHEDULER_HOOKS + MAIN_HOOKS}[role]
    for name in names:
        HookRegistry.register(TARGETS[name], HOOKS[name], HookType.AROUND)
    log.info("specdecode plugin %s registered %d hooks (%s process)", PLUGIN_VERSION,
             len(names), role)
