"""EngineClient: the HTTP process's handle on the engine. It owns the rank processes.

It spawns the TP ranks (spawn, never fork; threads per rank set before torch loads in them),
hosts the TCP store they rendezvous on (a free port picked by the OS), supervises them (a dead
rank ends the whole group with a message), and turns the ranks' output queue into callbacks,
a phase-record ring buffer and counters. Thread-safe. Must not tokenize or speak HTTP.

    client = EngineClient.start(EngineOptions(model_path="tiny-agreeing", load_format="dummy", tp_size=2))
    client.submit(GenRequest("r1", ids, max_new_tokens=32), on_update)
    client.set_config({"speculative_num_steps": 5, "speculative_draft_placement": "rank0"})
    client.close()
"""

from __future__ import annotations

import collections
import datetime
import math
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
from dataclasses import asdict
from multiprocessing.connection import wait
from typing import Any, Callable

from probes.names import R_PHASE_MS
from refengine.config import (ConfigError, EngineOptions, ModelLimits, SpecConfig, refuse_for_simulator,
                              resolve_config, simulator)
from refengine.messages import (Abort, ConfigApplied, GenRequest, GenUpdate, PhaseRecord, ProfileDone, ProfileStart,
                                ProfileStop, RankError, RankStats, Ready, SetConfig, Shutdown, SpecStats, Submit, Updates)

__all__ = ["EngineClient", "EngineOptions", "EngineStartError", "ConfigError", "GenRequest", "GenUpdate",
           "SpecStats", "EngineDeadError"]

RING = 4096


class EngineStartError(RuntimeError):
    """The ranks could not start (bad model path, init timeout, a rank died); one-line reason."""


class EngineDeadError(RuntimeError):
    """The engine is no longer running (a rank died or close() was called)."""


RANK_DEADLINE_ENV = "SPECDECODE_RANK_DEADLINE_S"
DEFAULT_RANK_DEADLINE_S = 120.0


def rank_deadline_s(environ: dict | None = None) -> float:
    """How long a rank may stay silent before the group counts as stalled: $SPECDECODE_RANK_DEADLINE_S,
    else 120 s (a first torch.compile or a large trace export runs that long without a heartbeat)."""
    text = (os.environ if environ is None else environ).get(RANK_DEADLINE_ENV)
    if not text:
        return DEFAULT_RANK_DEADLINE_S
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise EngineStartError(f"${RANK_DEADLINE_ENV}: expected seconds > 0, got {text[:40]!r}")
    return v


class EngineClient:
    def __init__(self, opts: EngineOptions):
        self.opts = opts
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        # Serialises config changes end to end (resolve, enqueue, wait for every rank, publish).
        # Separate from _lock on purpose: waiting on _cond releases _lock, and a change resolved
        # meanwhile against the old config would get the same epoch.
        self._config_lock = threading.Lock()
        self._callbacks: dict[str, Callable[[GenUpdate], None]] = {}
        self._records: collections.deque = collections.deque(maxlen=RING)
        self._seq = 0
        self._ready: dict[int, dict] = {}
        self._acks: dict[int, int] = {}
        self._profile_done: dict[int, tuple[str | None, str | None]] = {}
        self._rank_stats: dict[int, dict] = {}
        self._errors: dict[int, str] = {}
        self._config = SpecConfig(epoch=-1)
        self._config_dict: tuple[SpecConfig, dict] | None = None   # active_config's, per config
        self._limits = ModelLimits()
        # A profile simulator refuses settings it cannot drive, before they reach the ranks.
        self._simulator = simulator(opts)
        self._closing = False
        self._dead: str | None = None
        self._profiling = False
        self._last_profile: list[str] = []
        self._counters = collections.Counter()
        self._accept_hist: list[int] = []
        self._procs: list[mp.Process] = []
        # When each rank was last heard from (any message): every rank sends its stats at least
        # once a HEARTBEAT_S while its loop runs, so silence past the deadline is a hung rank.
        self._heard: dict[int, float] = {}
        self.rank_deadline_s = rank_deadline_s()
        self._armed = False     # arm_watchdog(): start-up and warm-up may be silent for longer

    # -- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def start(cls, opts: EngineOptions) -> "EngineClient":
        """Spawn the ranks, wait until every rank loaded its models, apply the initial config.

        Raises:
            EngineStartError: with the failing rank's last error line, or a timeout.
            ConfigError: the initial speculative settings are invalid.
        """
        client = cls(opts)
        try:
            client._spawn()
            client._wait_ready()
            # With an adaptive schedule the starting step is the base's (the schedule owns the steps).
            start = opts.speculative_num_steps if opts.speculative_adaptive_config is not None else 0
            cfg = resolve_config(SpecConfig(steps=start, topk=1, num_draft_tokens=start + 1,
                                            placement=opts.speculative_draft_placement, epoch=0),
                                 opts.initial_config(), client._limits)
            refuse_for_simulator(client._simulator, cfg)
            with client._config_lock:
                client._apply(cfg if cfg.epoch > 0 else SpecConfig(**{**asdict(cfg), "epoch": 1}))
        except BaseException:
            client.close()
            raise
        return client

    def _spawn(self) -> None:
        import torch.distributed as dist

        n = self.opts.tp_size
        if n < 1:
            raise EngineStartError(f"tp_size must be >= 1, got {n}")
        threads = self.opts.threads_per_rank or max(1, (os.cpu_count() or 1) // n)
        ctx = mp.get_context("spawn")
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=self.opts.init_timeout_s))
        self._in_q, self._out_q = ctx.Queue(), ctx.Queue()
        from refengine.rank import rank_main

        saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
        try:
            for r in range(n):
                p = ctx.Process(target=rank_main, name=f"refengine-rank{r}", daemon=True,
                                args=(r, n, self.opts, "127.0.0.1", self._store.port,
                                      self._in_q if r == 0 else None, self._out_q, threads))
                p.start()
                self._procs.append(p)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self._reader = threading.Thread(target=self._read_loop, name="refengine-reader", daemon=True)
        self._reader.start()
        self._supervisor = threading.Thread(target=self._supervise, name="refengine-supervisor", daemon=True)
        self._supervisor.start()
        self._watchdog = threading.Thread(target=self._watch_ranks, name="refengine-watchdog", daemon=True)
        self._watchdog.start()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.opts.init_timeout_s + 120
        with self._cond:
            while len(self._ready) < self.opts.tp_size:
                if self._dead:
                    raise EngineStartError(self._dead)
                if time.monotonic() > deadline:
                    raise EngineStartError(f"ranks not ready after {self.opts.init_timeout_s + 120:.0f} s "
                                           f"({len(self._ready)}/{self.opts.tp_size} ready)")
                self._cond.wait(0.1)
            self._limits = self._ready[0]["limits"]

    def alive(self) -> bool:
        return self._dead is None and not self._closing

    @property
    def death_message(self) -> str | None:
        """Why the engine stopped, when a rank died (None while alive or after close())."""
        return self._dead

    def close(self) -> None:
        """Stop every rank; no child process is left behind."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        if self._procs and all(p.is_alive() for p in self._procs):
            try:
                self._in_q.put(Shutdown())
            except Exception:
                pass
            deadline = time.monotonic() + 5
            for p in self._procs:
                p.join(max(0.1, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join(2)
        self._fail_pending("engine closed")
        with self._cond:
            self._cond.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- requests --------------------------------------------------------------------------------
    def submit(self, req: GenRequest, on_update: Callable[[GenUpdate], None]) -> None:
        """Queue a request; `on_update` is called from the client's reader thread for every
        batch of new tokens, the last time with finished=True (also on abort or engine death)."""
        with self._lock:
            if not self.alive():
                on_update(GenUpdate(req.rid, [], True, "error", error=self._dead or "engine closed"))
                return
            if req.rid in self._callbacks:
                # Never re-bind a live id: the first request's updates would reach the second's
                # callback and the first would wait forever (SGLang refuses it the same way).
                on_update(GenUpdate(req.rid, [], True, "error", error=f"Duplicate request ID detected: {req.rid}"))
                return
            self._callbacks[req.rid] = on_update
            self._counters["requests"] += 1
            self._counters["prompt_tokens"] += len(req.input_ids)
        self._in_q.put(Submit(req))

    def abort(self, rid: str) -> None:
        if self.alive():
            self._in_q.put(Abort(rid))

    def live_requests(self) -> int:
        """Requests submitted whose final update has not been delivered yet."""
        with self._lock:
            return len(self._callbacks)

    # -- configuration ---------------------------------------------------------------------------
    def set_config(self, changes: dict[str, Any]) -> dict:
        """Validate `changes` as one resulting config and apply it on every rank between two
        iterations; returns the active config after all ranks applied it.

        Raises:
            ConfigError: invalid change (nothing applied); EngineDeadError: the engine is gone.
        """
        with self._config_lock:
            cfg = resolve_config(self._config, changes, self._limits)
            refuse_for_simulator(self._simulator, cfg)
            if cfg == self._config:
                return self.active_config()
            self._apply(cfg)
            return self.active_config()

    def _apply(self, cfg: SpecConfig) -> None:
        """Send `cfg` to the ranks and wait until every rank applied it; only then is it the
        active config (/server_info). The caller holds _config_lock, so one change is in flight
        at a time: rank 0 never sees two configs in one command (it would apply only the last)."""
        self._require_alive()
        self._in_q.put(SetConfig(cfg))
        deadline = time.monotonic() + 120
        with self._cond:
            while any(self._acks.get(r, -1) < cfg.epoch for r in range(self.opts.tp_size)):
                self._require_alive()
                if time.monotonic() > deadline:
                    raise EngineDeadError("ranks did not apply the config within 120 s")
                self._cond.wait(0.05)
            self._config = cfg

    def active_config(self) -> dict:
        """steps, topk, num_draft_tokens, placement, epoch (plus the launch-time simulator flag)."""
        cfg = self._config
        cached = self._config_dict
        if cached is None or cached[0] is not cfg:
            # Built once per applied config (epoch), not per scrape: asdict deep-copies the
            # adaptive schedule, and /metrics and /server_info read this on every request.
            d = cfg.as_dict()
            d["simulate_accept"] = self.opts.speculative_simulate_accept
            cached = self._config_dict = (cfg, d)
        return dict(cached[1])   # a caller may add keys; the schedule inside is shared, read-only

    # -- profiling -------------------------------------------------------------------------------
    def start_profile(self, output_dir: str, num_steps: int | None = None, activities: list[str] | None = None,
                      with_stack: bool = False, record_shapes: bool = False, profile_id: str | None = None) -> None:
        """Start torch.profiler on every rank; with num_steps it stops by itself after that many
        iterations. Files: `{output_dir}/{profile_id}-TP-{rank}.trace.json.gz`."""
        self._require_alive()
        with self._lock:
            if self._profiling:
                raise RuntimeError("a profile is already running")
            self._profiling = True
            self._profile_done = {}
        self._in_q.put(ProfileStart({"output_dir": os.path.abspath(output_dir), "num_steps": num_steps,
                                           "activities": activities, "with_stack": with_stack,
                                           "record_shapes": record_shapes,
                                           "profile_id": profile_id or str(int(time.time()))}))

    def stop_profile(self, timeout: float = 120.0) -> list[str]:
        """Stop the running profile (or collect one that stopped after num_steps) and return the
        trace paths, one per rank."""
        with self._lock:
            if not self._profiling:
                if self._last_profile:
                    return list(self._last_profile)
                raise RuntimeError("no profile is running")
        if len(self._profile_done) < self.opts.tp_size:
            self._in_q.put(ProfileStop())
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._profile_done) < self.opts.tp_size:
                self._require_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("ranks did not write their traces in time")
                self._cond.wait(0.05)
            self._profiling = False
            errors = [e for _, e in self._profile_done.values() if e]
            paths = [self._profile_done[r][0] for r in sorted(self._profile_done) if self._profile_done[r][0]]
            self._last_profile = paths
        if errors:
            raise RuntimeError(errors[0])
        return paths

    # -- observation -----------------------------------------------------------------------------
    def phase_records(self, after_seq: int = 0, limit: int = 1024) -> tuple[int, list[dict]]:
        """Records with seq > after_seq (oldest first, at most `limit`), and the seq to ask after
        next. Records older than the ring (4096) are gone: the caller sees a gap in seq."""
        with self._lock:
            out = [r for r in self._records if r["seq"] > after_seq][:limit]
            return (out[-1]["seq"] if out else max(after_seq, 0)), out

    def stats(self) -> dict:
        """Counters for /metrics and /server_info (cumulative since start)."""
        with self._lock:
            c = self._counters
            verify = c["verify_ct"]
            per_rank = {r: {"phase_seconds": {p: v / 1e3 for p, v in s.get(R_PHASE_MS, {}).items()},
                            "phase_comm_seconds": {p: v / 1e3 for p, v in s.get("comm_ms", {}).items()},
                            "iterations": s.get("iterations", 0), "comm_calls_by_op": s.get("comm_by_op", {}),
                            "comm_bytes": s.get("comm_bytes", {}),
                            "comm_graph_calls": s.get("comm_graph_calls", {}), "graphs": s.get("graphs", {})}
                        for r, s in self._rank_stats.items()}
            running = len(self._callbacks)
            return {
                "num_requests_total": c["requests"], "num_running_reqs": running,
                "prompt_tokens_total": c["prompt_tokens"], "generation_tokens_total": c["generation_tokens"],
                "iterations_total": c["iterations"], "decode_tokens_total": c["committed"],
                "spec_verify_ct_total": verify, "spec_accepted_drafts_total": c["accepted"],
                "avg_spec_accept_length": (c["committed"] / verify) if verify else None,
                "spec_correct_drafts_histogram": list(self._accept_hist),
                "accept_position_total": {k: sum(self._accept_hist[k:]) for k in range(1, len(self._accept_hist))},
                "per_rank": per_rank, "emulated_comm": self.opts.emulate_comm_latency,
                "simulated_accept": self.opts.speculative_simulate_accept, "config": self.active_config(),
            }

    def rank_info(self) -> list[dict]:
        """tp_rank, pid, pci_bus_id (None on CPU), host per rank."""
        return [{k: v for k, v in self._ready[r].items() if k in ("tp_rank", "pid", "pci_bus_id", "host")}
                for r in sorted(self._ready)]

    def rank_env(self) -> list[dict[str, str]]:
        """Per rank, the NCCL/CUDA communication variables it runs with (inherited from this
        process's environment, plus EngineOptions.env)."""
        return [dict(self._ready[r].get("env", {})) for r in sorted(self._ready)]

    def graph_info(self) -> list[dict]:
        """Per rank, the graph mode in effect and why it differs from the one asked for."""
        return [dict(self._ready[r].get("graphs", {})) for r in sorted(self._ready)]

    def model_info(self) -> dict:
        """Shapes and ids of the loaded models (vocab_size, eos_token_ids, aux_layer_ids, ...)."""
        return dict(self._ready[0]["model"]) if 0 in self._ready else {}

    @property
    def limits(self) -> ModelLimits:
        return self._limits

    # -- threads ---------------------------------------------------------------------------------
    def _require_alive(self) -> None:
        if self._dead:
            raise EngineDeadError(self._dead)
        if self._closing:
            raise EngineDeadError("engine closed")

    def _read_loop(self) -> None:
        while True:
            try:
                item = self._out_q.get(timeout=0.2)
            except queue.Empty:
                if self._closing or self._dead:
                    return
                continue
            except (EOFError, OSError):
                return
            try:
                self._dispatch(item)
            except Exception as e:  # a failing callback must not stop the reader
                import sys
                print(f"refengine: update callback failed: {e!r}", file=sys.stderr)

    def _dispatch(self, item: object) -> None:
        self._heard[getattr(item, "rank", 0)] = time.monotonic()    # updates and records: rank 0's
        if isinstance(item, Updates):
            with self._lock:
                cbs = [(self._callbacks.pop(u.rid, None) if u.finished else self._callbacks.get(u.rid), u)
                       for u in item.updates]
                self._counters["generation_tokens"] += sum(len(u.token_ids) for u in item.updates)
            for cb, u in cbs:
                if cb is not None:
                    try:
                        cb(u)
                    except Exception as e:  # one request's failing callback must not cost the others theirs
                        print(f"refengine: update callback failed: {e!r}", file=sys.stderr)
            return
        with self._cond:
            self._on_message(item)
            self._cond.notify_all()

    def _on_message(self, item: object) -> None:
        """Every rank message but updates (under _cond)."""
        match item:
            case PhaseRecord(rec):
                self._seq += 1
                rec["seq"] = self._seq
                self._records.append(rec)
                c = self._counters
                c["iterations"] += 1
                c["committed"] += rec["committed"]
                # `accepted` has one entry per request whose result was kept: `bs` also counts
                # rows the overlap scheduler ran for requests already finished (`dropped`).
                c["verify_ct"] += len(rec["accepted"])
                if rec["steps"] > 0:
                    c["accepted"] += sum(rec["accepted"])
                    for a in rec["accepted"]:
                        while len(self._accept_hist) <= a:
                            self._accept_hist.append(0)
                        self._accept_hist[a] += 1
            case Ready(rank, info):
                self._ready[rank] = info
            case ConfigApplied(rank, epoch):
                self._acks[rank] = max(self._acks.get(rank, -1), epoch)
            case ProfileDone(rank, path, error):
                self._profile_done[rank] = (path, error)
                if len(self._profile_done) == self.opts.tp_size:
                    self._profiling = False
                    self._last_profile = [self._profile_done[r][0] for r in sorted(self._profile_done)
                                          if self._profile_done[r][0]]
            case RankStats(rank, stats):
                self._rank_stats[rank] = stats
            case RankError(rank, tb):
                self._errors[rank] = tb

    def _supervise(self) -> None:
        sentinels = {p.sentinel: (r, p) for r, p in enumerate(self._procs)}
        ready = wait(list(sentinels))
        if self._closing:
            return
        r, p = sentinels[ready[0]]
        p.join(1)
        time.sleep(0.2)   # let the reader pick up the rank's own error report
        err = self._errors.get(r, "").strip().splitlines()
        why = err[-1] if err else f"exit code {p.exitcode}"
        msg = f"TP rank {r} (pid {p.pid}) died: {why}; ending all ranks"
        with self._cond:
            self._dead = msg
            self._cond.notify_all()
        for q in self._procs:
            if q.is_alive():
                q.terminate()
        for q in self._procs:
            q.join(2)
            if q.is_alive():
                q.kill()
        self._fail_pending(msg)

    def arm_watchdog(self) -> None:
        """From now on a rank silent past rank_deadline_s stalls the group (called once the server
        is warm: the first iterations compile and capture, and may run long without a heartbeat)."""
        now = time.monotonic()
        for r in range(self.opts.tp_size):
            self._heard[r] = max(self._heard.get(r, now), now)
        self._armed = True

    def stalled(self) -> str | None:
        """Why the group is stalled (a rank silent past rank_deadline_s: hung, stopped, or stuck in
        a collective), or None. Only once armed, never once the group is dead."""
        if not self._armed or self._dead or self._closing:
            return None
        now = time.monotonic()
        late = [(now - t, r) for r, t in self._heard.items() if now - t > self.rank_deadline_s]
        if not late:
            return None
        silent, r = max(late)
        return f"TP rank {r} sent nothing for {silent:.0f} s (deadline {self.rank_deadline_s:g} s): hung or stopped"

    def _watch_ranks(self) -> None:
        """While the group is stalled, its requests fail at once (they would wait UPDATE_TIMEOUT_S)
        and are aborted in the engine, so a rank that resumes drops them."""
        while not (self._closing or self._dead):
            time.sleep(1.0)
            why = self.stalled()
            if why is None:
                continue
            with self._lock:
                cbs, self._callbacks = self._callbacks, {}
            for rid, cb in cbs.items():
                self._in_q.put(Abort(rid))
                try:
                    cb(GenUpdate(rid, [], True, "error", error=why))
                except Exception:  # noqa: BLE001 - one request's callback must not cost the others theirs
                    pass

    def _fail_pending(self, msg: str) -> None:
        with self._lock:
            cbs, self._callbacks = self._callbacks, {}
        for rid, cb in cbs.items():
            try:
                cb(GenUpdate(rid, [], True, "error", error=msg))
            except Exception:
                pass
