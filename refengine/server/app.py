"""The `serve` process: the engine client, the HTTP server, and the threads that watch them.

Owns the lifecycle (bind, start ranks, warm up, print the ready line, follow the phase stream for
metrics and the decode log, supervise the ranks, shut down on SIGINT/SIGTERM or a dead rank with no
child left). Must not parse HTTP (handlers.py) or compute statistics itself (phase_stats.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from probes.names import DRAFT_TOKENS, ENGINE_KNOBS, PLACEMENT, R_DRAFT_TOKENS, R_STEPS, STEPS, TOPK
from refengine.config import CONFIG_KEYS
from refengine.server import decode_log
from refengine.server.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from refengine.server.generation import Admission, Generation, run_all, slot_problems
from refengine.server.handlers import Handler
from refengine.server.inputs import BadRequest, GenerateInput, parse_generate
from refengine.server.metrics import Metrics
from refengine.server.options import OptionsError, ServerOptions, is_loopback, parse_options
from refengine.server.outputs import RequestOutput
from refengine.server.phase_stats import PhaseStats
from refengine.server.profiles import ProfileRequest, ProfileRequestError, TraceFiles, restrict_profile_request
from refengine.server.tokenizer import load_tokenizer

log = logging.getLogger("refengine.server")

READY_LINE = "The server is fired up and ready to roll!"
WARMUP_PROMPT = "The capital city of France is"
FOLLOW_PERIOD_S = 0.05
SUPERVISE_PERIOD_S = 0.25
SHUTDOWN_GRACE_S = 3.0



def shown_path(path: str | None) -> str | None:
    """A model path as the server reports it: the shipped model as `refengine/data/...`, so
    recordings and reports made from it name no machine's directories; other paths as given."""
    if not path:
        return path
    pkg = Path(__file__).resolve().parents[1]
    try:
        return str(Path("refengine") / Path(path).resolve().relative_to(pkg))
    except ValueError:
        return path

def active_tier(cfg: dict[str, Any], ps: dict[str, Any]) -> tuple[int, int]:
    """(steps, num_draft_tokens) running now: under an adaptive schedule the tier of the latest
    record of this epoch (SGLang reports the active tier), else the configured ones."""
    tier = ps.get("adaptive_tier")
    if cfg.get("adaptive") is not None and cfg.get("pinned") is not None:
        return cfg["pinned"], cfg["pinned"] + 1      # a pin switches at once (the plugin's _activate)
    if cfg.get("adaptive") is not None and tier is not None and tier[0] == cfg["epoch"]:
        return tier[1], tier[2]
    return cfg["steps"], cfg[R_DRAFT_TOKENS]


def knob_values(cfg: dict[str, Any], steps: Any, num_draft_tokens: Any) -> dict[str, Any]:
    """The engine's knobs (CONFIG_KEYS, the subset of probes.names.KNOBS it supports) under their
    server-arg names, from a config dict; steps and draft tokens as running (an adaptive tier's)."""
    running = {R_STEPS: steps, R_DRAFT_TOKENS: num_draft_tokens}
    return {arg: running.get(field, cfg.get(field)) for arg, field in CONFIG_KEYS.items()}


def say(message: str, tp_size: int = 1) -> None:
    """One log line in SGLang's `[time TPn] message` format on stdout."""
    print(decode_log.log_line(message, tp_size), flush=True)


class InFlight:
    """Counts requests being handled (a context manager), so shutdown can wait for them briefly."""

    def __init__(self) -> None:
        self._n = 0
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        with self._cond:
            self._n += 1

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._n -= 1
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._n == 0, timeout)


class StartupInterrupted(BaseException):
    """SIGINT/SIGTERM arrived while the ranks were starting (BaseException: it must unwind them)."""


MAX_CONNECTIONS = 512
_BUSY_BODY = b'{"error": {"message": "too many connections; try again", "type": "ServiceUnavailable", "code": 503}}'
BUSY_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n" % len(_BUSY_BODY) + _BUSY_BODY)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The stdlib's listen backlog is 5: a burst of connects beyond it waits for a SYN retry (1 s).
    request_queue_size = 1024
    # One thread per connection: past this many open at once a new one gets a 503 and is closed
    # without a thread (3000 half-sent requests made 3000 threads, each held up to 120 s).
    max_connections = MAX_CONNECTIONS

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(BUSY_REPLY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or drops its connection is routine, not a server fault: one debug
        # line instead of socketserver's traceback on stderr.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("connection from %s ended: %s", client_address, exc)
            return
        super().handle_error(request, client_address)

    def __init__(self, addr: tuple[str, int], handler: type, family: int) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__(addr, handler)


def default_model() -> dict[str, Any]:
    """The shipped tiny model when it is installed, else the agreeing random-weight preset."""
    from refengine.data import TINY_DRAFT_DIR, TINY_TARGET_DIR

    if (TINY_TARGET_DIR / "config.json").is_file() and (TINY_DRAFT_DIR / "config.json").is_file():
        return {"model_path": str(TINY_TARGET_DIR), "speculative_draft_model_path": str(TINY_DRAFT_DIR),
                "load_format": "auto"}
    return {"model_path": "tiny-agreeing", "load_format": "dummy"}


def engine_options(opts: ServerOptions) -> Any:
    """Map `serve` flags onto the engine's EngineOptions (fields follow SGLang's names)."""
    from refengine.config import EngineOptions

    defaults = EngineOptions()
    kw: dict[str, Any] = {
        "load_format": opts.load_format, "tp_size": opts.tp_size, "device": opts.device,
        "dtype": {"float": "float32", "half": "float16"}.get(opts.dtype, opts.dtype),  # SGLang's aliases
        PLACEMENT: opts.speculative_draft_placement,
        "speculative_simulate_accept": opts.speculative_simulate_accept,
        "speculative_simulate_accept_profile": opts.simulate_profile,
        "emulate_comm_latency": opts.emulate_comm_latency, "random_seed": opts.random_seed,
        "speculative_draft_model_path": opts.speculative_draft_model_path,
        "cuda_graph": "off" if opts.disable_cuda_graph else opts.cuda_graph_mode,
        "cuda_graph_max_graphs": opts.cuda_graph_max_graphs,
        "enable_torch_compile": opts.enable_torch_compile, "torch_compile_max_bs": opts.torch_compile_max_bs,
        "disable_overlap_schedule": opts.disable_overlap_schedule,
        "speculative_use_rejection_sampling": opts.speculative_use_rejection_sampling,
        "speculative_adaptive_config": opts.adaptive_schedule,
    }
    if opts.model_path is not None:
        kw["model_path"] = opts.model_path
    else:
        for k, v in default_model().items():
            if k != "speculative_draft_model_path" or opts.speculative_draft_model_path is None:
                kw[k] = v
    if opts.max_running_requests is not None:
        kw["max_running_requests"] = opts.max_running_requests
    if opts.context_length is not None:
        kw["context_length"] = opts.context_length
    for k in ("chunked_prefill_size", "max_prefill_tokens"):
        if getattr(opts, k) is not None:
            kw[k] = getattr(opts, k)
    if opts.speculative_algorithm == "NONE":
        kw[STEPS] = 0
        kw["speculative_algorithm"] = "NONE"   # no draft at all: the plain-decoding baseline
        kw["speculative_draft_model_path"] = None
    else:
        for k in (STEPS, TOPK, DRAFT_TOKENS):
            if getattr(opts, k) is not None:
                kw[k] = getattr(opts, k)
    kw = {k: v for k, v in kw.items() if hasattr(defaults, k)}
    return EngineOptions(**kw)


class ServerApp:
    """State shared by the HTTP handlers: the options, the engine client, metrics and trace files."""

    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.client: Any = None
        self.tokenizer: Any = None
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.exit_code = 0
        self.startup_time = time.time()
        self.launch_config: dict[str, Any] = {}
        self.phase_stats = PhaseStats(interval=opts.decode_log_interval, speculative=opts.speculative)
        self.traces = TraceFiles()
        self.metrics = Metrics(opts.model_name, self.metrics_snapshot)
        self._profile_lock = threading.Lock()
        self.admission: Admission | None = None
        self._profile_started = False
        self.model: dict[str, Any] = {}
        self.engine_opts = engine_options(opts)
        self.httpd: _HTTPServer | None = None
        self.requests_in_flight = InFlight()
        self.last_iteration_t = 0.0
        self.chat_template: ChatTemplate | None = None
        self.chat_template_error = "the server is starting"

    # ----- lifecycle ------------------------------------------------------------------------------

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self.opts.host else socket.AF_INET
        handler = type("BoundHandler", (Handler,), {"app": self})
        self.httpd = _HTTPServer((self.opts.host, self.opts.port), handler, family)

    @property
    def url(self) -> str:
        assert self.httpd is not None
        host, port = self.httpd.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"

    def start_engine(self) -> None:
        from refengine.client import EngineClient

        self.client = EngineClient.start(self.engine_opts)
        self.admission = Admission(self.client, self.max_running_requests())
        self.model = self.client.model_info()
        self.tokenizer = load_tokenizer(self.engine_opts.model_path, int(self.model["vocab_size"]))
        try:
            self.chat_template = load_chat_template(self.engine_opts.model_path)
        except ChatTemplateError as e:
            # Everything but the chat route still works; the route answers with this reason.
            self.chat_template_error = str(e)
            say(f"No chat template: {e}", self.opts.tp_size)
        self.launch_config = dict(self.client.active_config())
        self.startup_time = time.time()

    def warmup(self) -> None:
        # SGLang sends one 8-token /generate before announcing readiness; so do we (greedy).
        item = parse_generate({"text": WARMUP_PROMPT, "sampling_params": {
            "max_new_tokens": 8, "temperature": 0}}).items[0]
        out = run_all([self.new_generation(item, count=False)], deadline_s=300.0)[0]
        if (out.finish_reason or {}).get("type") == "abort":
            raise RuntimeError(f"warmup request failed: {out.finish_reason.get('message')}")

    def serve(self) -> int:
        """Start the engine behind the already-bound socket, announce readiness, run until told to stop."""
        assert self.httpd is not None
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                         name="http", daemon=True).start()
        try:
            try:
                self.start_engine()
                if not self.opts.skip_server_warmup:
                    self.warmup()
            except StartupInterrupted:
                raise
            except Exception as e:  # noqa: BLE001 - report why the engine did not start, then clean up
                say(f"The engine failed to start: {type(e).__name__}: {e}", self.opts.tp_size)
                self.request_stop(1)
            if not self.stopping.is_set():
                for target, name in ((self._follow_phases, "phase-follower"), (self._supervise, "supervisor")):
                    threading.Thread(target=target, name=name, daemon=True).start()
                self.client.arm_watchdog()
                self.ready.set()
                say(f"{READY_LINE} Serving at {self.url}", self.opts.tp_size)
            while not self.stopping.wait(0.5):
                pass
        except StartupInterrupted:
            self.stopping.set()  # a signal during start-up; EngineClient.start cleaned up its ranks
        finally:
            self.shutdown()
        return self.exit_code

    def request_stop(self, code: int = 0) -> None:
        if not self.stopping.is_set():
            self.exit_code = code
            self.stopping.set()

    def shutdown(self) -> None:
        self.ready.clear()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self.client is not None:
            self.client.close()  # fails every pending request with the reason
        # Let the handlers tell their clients (final chunk, error event, [DONE]) before exit
        # ends their daemon threads.
        self.requests_in_flight.wait_idle(SHUTDOWN_GRACE_S)

    def _supervise(self) -> None:
        while not self.stopping.wait(SUPERVISE_PERIOD_S):
            if not self.client.alive():
                reason = self.client.death_message or "a rank process exited"
                say(f"Shutting down: the engine died ({reason}).", self.opts.tp_size)
                self.request_stop(1)
                return

    def _follow_phases(self) -> None:
        after = 0
        while not self.stopping.wait(FOLLOW_PERIOD_S):
            try:
                after, records = self.client.phase_records(after, 4096)
            except Exception:  # noqa: BLE001 - the supervisor reports a dead engine
                continue
            if records:
                self.last_iteration_t = float(records[-1].get("t", time.time()))
            for w in self.phase_stats.feed(records):
                self._log_window(w)

    def _log_window(self, w: Any) -> None:
        st = self._load()
        say(decode_log.decode_line(
            running=st["num_running_reqs"], tokens=st["num_used_tokens"], token_usage=st["token_usage"],
            speculative=self.opts.speculative, accept_len=w.accept_len, accept_rate=w.accept_rate,
            device=self.opts.device, gen_throughput=w.gen_throughput, queued=st["num_queue_reqs"],
            graph=self._graph_on()),
            self.opts.tp_size)

    def _graph_on(self) -> bool:
        info = self.client.graph_info() if self.client is not None else []
        return bool(info) and info[0].get("mode") == "cuda"

    def _load(self) -> dict[str, Any]:
        """Running/queued requests and KV tokens in use (prompt + generated of running requests)."""
        running, waiting = self.admission.snapshot() if self.admission else ([], [])
        used = sum(g.out.prompt_tokens + len(g.out.output_ids) for g in running)
        capacity = self.max_running_requests() * (self.context_length() or 1)
        return {"num_running_reqs": len(running), "num_queue_reqs": len(waiting),
                "num_used_tokens": used, "token_usage": used / capacity if capacity else 0.0}

    # ----- engine facade used by the handlers ----------------------------------------------------

    def engine_alive(self) -> bool:
        return self.client is not None and self.client.alive()

    def engine_stalled(self) -> str | None:
        """Why the ranks count as hung (one silent past its deadline), or None."""
        return self.client.stalled() if self.client is not None else None

    def vocab_size(self) -> int | None:
        return self.model.get("vocab_size")

    def context_length(self) -> int | None:
        return self.model.get("context_length")

    def max_running_requests(self) -> int:
        return int(self.engine_opts.max_running_requests)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def busy(self) -> bool:
        running, waiting = self.admission.snapshot() if self.admission else ([], [])
        return bool(running or waiting)

    def new_generation(self, item: GenerateInput, count: bool = True, streaming: bool = False) -> Generation:
        if self.stopping.is_set():
            raise BadRequest("the server is shutting down", 503, "ServiceUnavailable")

        def finished(out: RequestOutput) -> None:
            if count:
                e2e = (out.finished_at or time.time()) - out.created
                verify = out.spec.spec_verify_ct if out.spec else 0
                self.metrics.request_finished(out.prompt_tokens, len(out.output_ids), verify, e2e,
                                              out.time_per_output_token(), streaming=streaming)

        assert self.admission is not None
        gen = Generation(self.admission, self.tokenizer, item, speculative=self.opts.speculative,
                         context_length=self.context_length(), on_finish=finished,
                         launch_num_draft_tokens=int(self.launch_config.get(R_DRAFT_TOKENS) or 1))
        if count:
            gen.out.latency = self.metrics.observer(streaming)   # TTFT and ITL as outputs arrive
        return gen

    def slots(self) -> dict[str, Any]:
        """The slot invariant for tests and operators: what is held, and `problems` (empty when
        "nothing in flight => no slot held" holds; see generation.slot_problems)."""
        held = self.admission.held() if self.admission else {"running": [], "waiting": [], "reserved_rids": [],
                                                             "in_flight": []}
        live = self.client.live_requests() if self.client is not None else 0
        return {**held, "engine_requests": live, "problems": slot_problems(held, live)}

    def set_config(self, changes: dict[str, Any]) -> dict[str, Any]:
        from refengine.client import ConfigError, EngineDeadError

        try:
            return self.client.set_config(changes)
        except ConfigError as e:
            raise BadRequest(str(e)) from None
        except EngineDeadError as e:
            raise BadRequest(f"the engine is not running: {e}", 503, "ServiceUnavailable") from None

    def start_profile(self, req: ProfileRequest) -> None:
        if self.opts.restrict_profiling or not is_loopback(self.opts.host):
            # Off loopback (or asked to): output_dir stays inside the trace root and an unbounded
            # profile is capped. On loopback SGLang's accepted inputs win.
            try:
                req = restrict_profile_request(req)
            except ProfileRequestError as e:
                raise BadRequest(str(e)) from None
        with self._profile_lock:
            try:
                os.makedirs(req.output_dir, exist_ok=True)
            except OSError as e:
                raise BadRequest(f"output_dir {req.output_dir!r}: {e.strerror}") from None
            self.traces.add_dir(req.output_dir)
            try:
                self.client.start_profile(req.output_dir, req.num_steps, list(req.activities),
                                          req.with_stack, req.record_shapes, req.file_stem)
            except RuntimeError as e:
                raise BadRequest(f"cannot start profiling: {e}") from None
            self._profile_started = True

    def stop_profile(self) -> list[str]:
        with self._profile_lock:
            # A profile that stopped by itself after num_steps can still be collected once.
            if not self._profile_started:
                raise BadRequest("no profile is running; POST /start_profile first")
            try:
                paths = self.client.stop_profile()
            except RuntimeError as e:
                raise BadRequest(f"cannot stop profiling: {e}") from None
            self._profile_started = False
            return paths

    def phase_page(self, after: int, limit: int) -> dict[str, Any]:
        nxt, records = self.client.phase_records(after, limit)
        if not records and after > 0:
            # `after` beyond the end means the reader followed an earlier server on this port
            # (seq restarts at 1): point it at the real end so it is not stuck forever.
            _, tail = self.client.phase_records(-1, 4096)
            newest = tail[-1]["seq"] if tail else 0
            nxt = min(nxt, newest)
        dropped = max(0, records[0]["seq"] - max(after, 0) - 1) if records else 0
        return {"next": nxt, "dropped": dropped, "records": records}

    # ----- information ---------------------------------------------------------------------------

    def metrics_snapshot(self) -> dict[str, Any]:
        if self.client is None or not self.ready.is_set():
            return {}
        snap: dict[str, Any] = dict(self._load())
        try:
            per_rank = self.client.stats().get("per_rank", {})
        except Exception:  # noqa: BLE001 - a scrape during shutdown sees no engine, not a crash
            per_rank = {}
        for key in ("phase_seconds", "phase_comm_seconds"):
            snap[key] = {(phase, rank): v for rank, st in per_rank.items() for phase, v in st.get(key, {}).items()}
        snap["iterations"] = {rank: st.get("iterations", 0) for rank, st in per_rank.items()}
        ps = self.phase_stats.snapshot()
        # Collective counts per phase travel in rank 0's phase records (every rank runs the same ones).
        snap["phase_comm_calls"] = {(phase, 0): n for phase, n in ps["comm_calls"].items()}
        for k in ("decode_tokens", "forward_seconds", "accept_position", "accept_len", "accept_rate",
                  "gen_throughput"):
            snap[k] = ps[k]
        try:
            cfg = self.client.active_config()
            steps, ndt = active_tier(cfg, ps)
            snap.update(spec_num_steps=steps, spec_eagle_topk=cfg["topk"],
                        spec_num_draft_tokens=ndt, placement=cfg["placement"],
                        epoch=cfg["epoch"])
            snap["rank_info"] = self.client.rank_info()
        except Exception:  # noqa: BLE001
            pass
        snap["emulated_comm"] = self.opts.emulate_comm_latency is not None
        snap["simulated_accept"] = self.opts.simulated_accept
        return snap

    def _launch_args(self) -> dict[str, Any]:
        d = self.opts.resolved_dict()
        lc = self.launch_config
        if lc:
            d.update(knob_values(lc, lc.get(R_STEPS), lc.get(R_DRAFT_TOKENS)))
        if self.httpd is not None:
            d["port"] = self.httpd.server_address[1]  # the real port when --port 0 picked one
        d["max_running_requests"] = self.max_running_requests()
        d["context_length"] = self.context_length()
        d["chunked_prefill_size"] = self.engine_opts.chunk_size()
        d["max_prefill_tokens"] = self.engine_opts.max_prefill_tokens
        d["model_path"] = shown_path(self.engine_opts.model_path)
        d["speculative_draft_model_path"] = shown_path(self.engine_opts.speculative_draft_model_path)
        d["load_format"] = self.engine_opts.load_format
        return d

    def _compiled_graphs(self) -> int | None:
        """Graphs torch.compile built, the most on any rank (None with compile off): benchmarks
        check it stops growing after warm-up."""
        counts = [r.get("graphs", {}).get("compiled_graphs") for r in self.client.stats()["per_rank"].values()]
        counts = [c for c in counts if c is not None]
        return max(counts) if counts else None

    def server_info(self) -> dict[str, Any]:
        launch = self._launch_args()
        state = dict(launch)
        cfg = self.client.active_config()
        ps = self.phase_stats.snapshot()
        steps, ndt = active_tier(cfg, ps)
        state.update(knob_values(cfg, steps, ndt))
        state[ENGINE_KNOBS] = list(CONFIG_KEYS)
        state.update(
            config_epoch=cfg["epoch"],
            world_size=self.opts.tp_size, startup_time=self.startup_time,
            effective_max_running_requests_per_dp=launch["max_running_requests"],
            last_gen_throughput=ps["gen_throughput"],
            avg_spec_accept_length=ps["avg_spec_accept_length"],
            emulated_comm=self.opts.emulate_comm_latency is not None,
            simulated_accept=self.opts.simulated_accept,
            torch_compile_graphs=self._compiled_graphs(),
            # SGLang's switch and the schedule in force (installed live or at launch); the pin as the
            # SGLang plugin names it (-1: the policy chooses). Records say which steps each iteration ran.
            speculative_adaptive=cfg["adaptive"] is not None, speculative_adaptive_config=cfg["adaptive"],
            specdecode_num_steps=-1 if cfg["pinned"] is None else cfg["pinned"],
        )
        return {
            **launch,
            "status": "ready" if self.ready.is_set() else "starting",
            "startup_time": self.startup_time,
            "max_total_num_tokens": self.max_running_requests() * (self.context_length() or 0),
            "max_req_input_len": self.context_length(),
            "internal_states": [state],
            "version": _version(),
            "engine": "refengine",
            "frontend": "python",
        }

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": shown_path(self.engine_opts.model_path),
            "served_model_name": self.opts.model_name,
            "tokenizer_path": shown_path(self.engine_opts.model_path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": self.engine_opts.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        }


def _version() -> str:
    """The installed package's version; from a source checkout (not installed, e.g. a GPU box
    running `python -m refengine`), the pyproject's version marked `+src`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specdecode-tune")
    except PackageNotFoundError:
        try:
            import tomllib
            pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
            return tomllib.loads(pyproject.read_text())["project"]["version"] + "+src"
        except (OSError, KeyError, ValueError):
            return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    try:
        opts = parse_options(argv)
    except OptionsError as e:
        print(f"specdecode-tune serve: error: {e}", file=sys.stderr)
        return 2
    app = ServerApp(opts)
    try:
        app.bind()
    except OSError as e:
        print(f"specdecode-tune serve: error: cannot listen on {opts.host}:{opts.port}: {e.strerror or e}",
              file=sys.stderr)
        return 2

    def on_signal(signum: int, _frame: Any) -> None:
        say(f"Received {signal.Signals(signum).name}; shutting down.", opts.tp_size)
        starting = not app.ready.is_set() and not app.stopping.is_set()
        app.request_stop(0)
        if starting:
            # The main thread is blocked starting the ranks: interrupt it so they are cleaned up now.
            raise StartupInterrupted()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return app.serve()
