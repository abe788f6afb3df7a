"""The rank process: entry point of every TP rank (started with spawn by refengine.client).

Rank 0 drives: it drains the client's command queue and broadcasts one command per iteration
(new requests, aborts, a config with its epoch, profiler start/stop) to the other ranks, which
follow. Every rank then runs the same Engine calls. Results leave through the output queue
(updates and phase records from rank 0, per-rank phase totals and acks from all), never through
extra collectives. A request the engine fails alone (bad parameters, a failed verify_sample) is
failed by every rank from the same inputs; rank 0's next command names the ones it failed, and a
rank that failed others is out of lock-step and ends the group (lockstep_error).

torch is imported only inside `rank_main`, after the thread count is set in the environment.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from probes.names import OTHER, R_PHASE_MS
from refengine.messages import (Abort, ConfigApplied, PhaseRecord, ProfileDone, ProfileStart, ProfileStop, RankError,
                                RankStats, Ready, SetConfig, Shutdown, Submit, Updates)

HEARTBEAT_S = 1.0     # idle rank 0 still broadcasts this often, so followers never time out
STATS_EVERY_S = 0.25  # how often every rank sends its cumulative phase totals


@dataclass
class Command:
    """What every rank does next, in this order: config, aborts, profiler, prefills, one step."""

    config: Any = None
    aborts: list[str] = field(default_factory=list)
    new: list[Any] = field(default_factory=list)
    profile_start: dict | None = None
    profile_stop: bool = False
    shutdown: bool = False
    failed: list[str] = field(default_factory=list)
    """The requests rank 0 failed while running the previous command (each rank must have too)."""

    @property
    def empty(self) -> bool:
        return not (self.config or self.aborts or self.new or self.profile_start or self.profile_stop or self.shutdown
                    or self.failed)


def lockstep_error(rank: int, leader: list[str], mine: list[str]) -> str | None:
    """Why this rank is out of lock-step with rank 0, or None: both must have failed the same
    requests (a rank that kept one rank 0 dropped would run different batches from now on)."""
    if sorted(leader) == sorted(mine):
        return None
    return (f"rank {rank} and rank 0 failed different requests: rank 0 {sorted(leader)}, "
            f"rank {rank} {sorted(mine)}; the ranks are out of lock-step")


def rank_main(rank: int, world: int, opts, store_host: str, store_port: int, in_q, out_q, threads: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ.update(opts.env)
    try:
        _run(rank, world, opts, store_host, store_port, in_q, out_q, threads)
    except Exception:  # report, then die: the supervisor ends the group with this message
        out_q.put(RankError(rank, traceback.format_exc()))
        raise SystemExit(1)


def _run(rank, world, opts, store_host, store_port, in_q, out_q, threads) -> None:
    import datetime
    import socket

    import torch
    import torch.distributed as dist

    from refengine.comm import Clock, Communicator, CudaClock
    from refengine.config import parse_latency
    from refengine.engine import Engine
    from refengine.loader import resolve_dtype
    from refengine.presets import load_models

    torch.set_num_threads(threads)
    # A rank only ever runs inference: no autograd state anywhere (with it on, a prefill's KV
    # writes made the pools require grad, and compiled code keyed on that recompiled).
    torch.set_grad_enabled(False)
    cuda = opts.device.startswith("cuda")
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    store = dist.TCPStore(store_host, store_port, world_size=None, is_master=False,
                          timeout=datetime.timedelta(seconds=opts.init_timeout_s))
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=max(60.0, opts.init_timeout_s)))
    cpu_group = dist.new_group(backend="gloo") if cuda else None
    comm = Communicator(rank, world, None, cpu_group, CudaClock() if cuda else Clock(),
                        parse_latency(opts.emulate_comm_latency))
    torch.manual_seed(opts.random_seed)
    dtype = resolve_dtype(opts.dtype, opts.device)
    want_draft = opts.speculative_algorithm != "NONE"
    target, head = load_models(opts.model_path, opts.speculative_draft_model_path, opts.load_format,
                               opts.random_seed, want_draft=want_draft, device=device)
    engine = Engine(opts, comm, target, head, device, dtype)
    bus_id = _pci_bus_id(torch, device) if cuda else None
    out_q.put(Ready(rank, {"tp_rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
                               "pci_bus_id": bus_id, "limits": engine.limits(), "env": _comm_env(),
                               "graphs": {"mode": engine.graphs.mode, "off_reason": engine.graphs.off_reason},
                               "model": _model_info(engine, target, head)}))
    Follower(engine, comm, in_q, out_q).loop()
    dist.destroy_process_group()
    # Flush our queue, then leave at once: interpreter teardown with torch loaded takes seconds.
    out_q.close()
    out_q.join_thread()
    os._exit(0)


ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS")


def _comm_env() -> dict[str, str]:
    """The communication-related environment this rank runs with (NCCL knobs such as
    NCCL_P2P_DISABLE must reach every rank: the spawned ranks inherit the parent's environment)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def _pci_bus_id(torch, device) -> str | None:
    """nvidia-smi's form (00000000:18:00.0), so NVML readings can be matched to ranks."""
    props = torch.cuda.get_device_properties(device)
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, str) or bus is None:
        return bus
    return f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"


def _model_info(engine, target, head) -> dict:
    tc = target.config
    info = {"vocab_size": tc.vocab_size, "hidden_size": tc.hidden_size, "num_hidden_layers": tc.num_hidden_layers,
            "eos_token_ids": list(tc.eos_token_ids), "aux_layer_ids": list(target.aux_layer_ids),
            "context_length": engine.opts.context_length, "dtype": str(engine.dtype).replace("torch.", "")}
    if head is not None:
        info["draft_vocab_size"] = head.config.draft_vocab_size
        info["draft_hidden_size"] = head.config.hidden_size
    return info


class Follower:
    """The per-rank loop; on rank 0 it is also the driver that builds the commands."""

    def __init__(self, engine, comm, in_q, out_q):
        self.engine, self.comm, self.in_q, self.out_q = engine, comm, in_q, out_q
        self.rank = comm.rank
        self.profiler = None
        self.profile_args: dict | None = None
        self.profile_steps = 0
        self.totals = {R_PHASE_MS: {}, "comm_ms": {}, "iterations": 0}
        self.last_stats = 0.0
        self.last_bcast = time.monotonic()
        self.pending_config = None
        self.failed: list[str] = []
        """The requests this rank failed (error updates) since the last command."""

    # rank 0 only -------------------------------------------------------------------------------
    def _next_command(self) -> Command:
        cmd = Command()
        busy = self.engine.busy
        deadline = time.monotonic() + (0 if busy else HEARTBEAT_S)
        while True:
            timeout = max(0.0, deadline - time.monotonic())
            try:
                item = self.in_q.get(timeout=timeout) if timeout > 0 and cmd.empty else self.in_q.get_nowait()
            except queue.Empty:
                break
            match item:
                case Submit(req):
                    cmd.new.append(req)
                case Abort(rid):
                    cmd.aborts.append(rid)
                case SetConfig(config):
                    cmd.config = config
                case ProfileStart(args):
                    cmd.profile_start = args
                case ProfileStop():
                    cmd.profile_stop = True
                case Shutdown():
                    cmd.shutdown = True
                    break
        if self.profile_args and self.profile_args.get("num_steps") and \
                self.profile_steps >= self.profile_args["num_steps"]:
            cmd.profile_stop = True
        return cmd

    def loop(self) -> None:
        world = self.comm.world
        while True:
            if self.rank == 0:
                cmd = self._next_command()
                self.engine.begin_command()
                if world > 1:
                    cmd.failed, self.failed = self.failed, []
                    self.comm.phase = OTHER
                    self.comm.broadcast_object(None if cmd.empty else cmd, 0)
            else:
                self.engine.begin_command()
                cmd = self.comm.broadcast_object(None, 0) or Command()
                mine, self.failed = self.failed, []
                why = lockstep_error(self.rank, cmd.failed, mine)
                if why is not None:
                    raise RuntimeError(why)
            if self._execute(cmd):
                return

    def _execute(self, cmd: Command) -> bool:
        e = self.engine
        if cmd.config is not None or cmd.shutdown:
            # The iteration in flight ran the old setting: read it first, so its record carries
            # the old epoch and every record after the ack carries the new one.
            self._publish(*e.drain())
        if cmd.config is not None:
            e.apply_config(cmd.config)
            self.out_q.put(ConfigApplied(self.rank, cmd.config.epoch))
        for rid in cmd.aborts:
            self._emit(e.abort(rid))
        if cmd.profile_start is not None:
            self._start_profile(cmd.profile_start)
        if cmd.profile_stop or (cmd.shutdown and self.profiler is not None):
            self._stop_profile()
        if cmd.shutdown:
            self._send_stats(force=True)
            return True

        def admit() -> None:
            for u in e.add_requests(cmd.new):    # one prefill batch (SGLang's PrefillAdder)
                self._emit(u)
        if e.busy or cmd.new:
            # New requests are prefilled after the next iteration is launched (Engine.step).
            self._publish(*e.step(admit if cmd.new else None))
            if self.profiler is not None:
                self.profile_steps += 1
                self.profiler.step()
        self._send_stats()
        return False

    def _publish(self, updates, record) -> None:
        """An iteration's record and updates; updates may come without a record (a prefill's first
        token read when no iteration was in flight)."""
        self._note_failed(updates)
        if record is not None:
            self._accumulate(record)
        if self.rank == 0:
            # The record first: a reader woken by a final update already has its iteration.
            if record is not None:
                self.out_q.put(PhaseRecord(record))
            if updates:
                self.out_q.put(Updates(list(updates)))

    def _emit(self, update) -> None:
        if update is not None:
            self._note_failed([update])
        if update is not None and self.rank == 0:
            self.out_q.put(Updates([update]))

    def _note_failed(self, updates) -> None:
        if self.comm.world > 1:
            self.failed += [u.rid for u in updates if u.finished and u.finish_reason == "error"]

    def _accumulate(self, record: dict) -> None:
        t = self.totals
        t["iterations"] += 1
        for key in (R_PHASE_MS, "comm_ms"):
            for p, v in record[key].items():
                t[key][p] = t[key].get(p, 0.0) + v

    def _send_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_stats >= STATS_EVERY_S:
            self.last_stats = now
            by_op = dict(self.comm.totals.by_op)
            self.out_q.put(RankStats(self.rank, {**self.totals, "comm_by_op": by_op,
                                                      "comm_bytes": dict(self.comm.totals.bytes),
                                                      "comm_calls": dict(self.comm.totals.calls),
                                                      "comm_graph_calls": dict(self.comm.totals.graph_calls),
                                                      "graphs": {**self.engine.graphs.stats_dict(),
                                                                 "compiled_graphs": self.engine.compiled_graphs()}}))

    # profiler ----------------------------------------------------------------------------------
    def _start_profile(self, args: dict) -> None:
        import torch

        if self.profiler is not None:
            return
        acts = []
        for a in args.get("activities") or ["CPU", "GPU"]:
            if a == "CPU":
                acts.append(torch.profiler.ProfilerActivity.CPU)
            elif a in ("GPU", "CUDA") and torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=acts, with_stack=bool(args.get("with_stack")),
                                               record_shapes=bool(args.get("record_shapes")))
        self.profiler.start()
        self.profile_args = args
        self.profile_steps = 0

    def _stop_profile(self) -> None:
        if self.profiler is None:
            self.out_q.put(ProfileDone(self.rank, None, "no profile is running"))
            return
        args, prof = self.profile_args, self.profiler
        self.profiler, self.profile_args = None, None
        prof.stop()
        path = os.path.join(args["output_dir"], f"{args['profile_id']}-TP-{self.rank}.trace.json.gz")
        try:
            os.makedirs(args["output_dir"], exist_ok=True)
            prof.export_chrome_trace(path)
            self.out_q.put(ProfileDone(self.rank, path, None))
        except Exception as e:  # a bad output dir must not kill the rank
            self.out_q.put(ProfileDone(self.rank, None, f"cannot write {path}: {e}"))
