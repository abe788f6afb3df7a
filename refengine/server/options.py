"""Command-line options of `serve`, with SGLang 0.5.23's flag names where SGLang has them.

Parses and validates only: what the flags mean for the engine is the engine's business, and this
module must not import torch or start anything.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from probes.api_key import ENV_VAR, ApiKeyError, resolve_api_key
from probes.api_key import redact_argv as key_redact_argv
from probes.names import PLACEMENTS, SHARDED

ALGORITHMS = ("EAGLE3", "NONE")
DTYPES = ("auto", "float32", "float", "float16", "half", "bfloat16", "float64")
SECRET_FLAGS = ("--api-key",)   # --api-key-file names a path, not a secret


class OptionsError(ValueError):
    """An invalid combination of flags; the message is one line for the operator."""


@dataclass(frozen=True)
class ServerOptions:
    model_path: str | None = None
    load_format: str = "auto"
    served_model_name: str | None = None
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_draft_placement: str = SHARDED
    speculative_simulate_accept: str | None = None
    speculative_simulate_accept_profile: str | None = None
    """The profile file as given; its checked contents travel in `simulate_profile`."""
    speculative_use_rejection_sampling: bool = False
    speculative_adaptive: bool = False
    speculative_adaptive_config: str | None = None
    """The adaptive config file as given; its checked contents travel in `adaptive_schedule`."""
    tp_size: int = 1
    device: str = "cpu"
    dtype: str = "auto"
    host: str = "127.0.0.1"
    port: int = 30000
    max_running_requests: int | None = None
    context_length: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    api_key: str | None = None
    restrict_profiling: bool = False
    enable_metrics: bool = True
    decode_log_interval: int = 40
    emulate_comm_latency: str | None = None
    skip_server_warmup: bool = False
    disable_cuda_graph: bool = False
    cuda_graph_mode: str = "auto"
    cuda_graph_max_graphs: int = 64
    disable_overlap_schedule: bool = False
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    random_seed: int = 0
    launch_command: list[str] = field(default_factory=list)
    simulate_profile: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    """The checked speculation profile (read once, here), for the engine's simulator."""
    adaptive_schedule: dict[str, dict] | None = field(default=None, repr=False, compare=False)
    """With --speculative-adaptive: the checked config (the file's, or SGLang's default), resolved."""

    @property
    def simulated_accept(self) -> bool:
        """Acceptance comes from the simulator (a curve, a mean accept length or a profile)."""
        return self.speculative_simulate_accept is not None or self.simulate_profile is not None

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm not in (None, "NONE")

    def resolved_dict(self) -> dict[str, Any]:
        """The launch arguments as /server_info shows them at top level (secrets hidden)."""
        d = asdict(self)
        d["api_key"] = None if self.api_key is None else "<redacted>"
        d["launch_command"] = redact_argv(self.launch_command)
        d["served_model_name"] = self.model_name
        d.pop("simulate_profile", None)   # the file's contents are the engine's, not a launch argument
        d.pop("adaptive_schedule", None)  # internal_states shows the config in force
        return d

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path or "refengine-tiny"


def redact_argv(argv: list[str]) -> str:
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
        elif a in SECRET_FLAGS:
            out.append(a)
            hide_next = True
        elif any(a.startswith(f + "=") for f in SECRET_FLAGS):
            out.append(a.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(a)
    return " ".join(a if "<redacted>" in a else shlex.quote(a) for a in out)


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _chunk_size(text: str) -> int:
    v = int(text)
    if v < 1 and v != -1:
        raise argparse.ArgumentTypeError(f"must be >= 1, or -1 for no chunking, got {v}")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _port(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {v}")
    return v


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors never echo a key (`--api-ke=K could match ...`)."""

    def error(self, message: str):  # noqa: ANN201 - argparse's signature
        super().error(re.sub(r"(--api[\w-]*)=(\S+)", r"\1=<redacted>", message))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="specdecode-tune serve",
        description="Run the reference EAGLE-3 engine as an SGLang-compatible HTTP server.",
    )
    m = p.add_argument_group("model")
    m.add_argument("--model-path", default=None,
                   help="checkpoint directory, or a random-weight preset name with --load-format dummy "
                        "(default: the shipped tiny model, else the tiny preset)")
    m.add_argument("--load-format", default="auto", choices=("auto", "dummy", "safetensors", "pt"))
    m.add_argument("--served-model-name", default=None)
    m.add_argument("--dtype", default="auto", choices=DTYPES)
    m.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    m.add_argument("--random-seed", type=int, default=0)
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", default=None, type=str.upper,
                   help="EAGLE3 (default) or NONE (EAGLE is accepted as EAGLE3)")
    s.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    s.add_argument("--speculative-num-steps", type=_nonneg_int, default=None)
    s.add_argument("--speculative-eagle-topk", type=_positive_int, default=None)
    s.add_argument("--speculative-num-draft-tokens", type=_positive_int, default=None)
    s.add_argument("--speculative-draft-placement", default=SHARDED, choices=PLACEMENTS,
                   help="where the draft runs: on the target's TP group, on every rank, or on rank 0")
    s.add_argument("--speculative-use-rejection-sampling", action="store_true",
                   help="topk 1 at temperature > 0: sample the chain from the draft and accept with "
                        "min(1, p/q) (SGLang's flag); default: target-only sampling")
    s.add_argument("--speculative-adaptive", action="store_true",
                   help="choose the steps per iteration by batch size and acceptance (SGLang's adaptive "
                        "policy; topk 1)")
    s.add_argument("--speculative-adaptive-config", default=None, metavar="FILE",
                   help='with --speculative-adaptive: JSON of batch-size thresholds, e.g. '
                        '{"1": {"candidate_steps": [1, 3, 5]}, "8": {"candidate_steps": [0, 1]}} '
                        "(default: SGLang's tiers)")
    s.add_argument("--speculative-simulate-accept", default=None,
                   help="force acceptance (the engine's simulator); off by default")
    s.add_argument("--speculative-simulate-accept-profile", default=None, metavar="FILE",
                   help="simulate acceptance from a speculation_profile.json (measured, chain for a chain; "
                        "steps up to its max_supported_k)")
    r = p.add_argument_group("runtime")
    r.add_argument("--tp-size", "--tensor-parallel-size", type=_positive_int, default=1)
    r.add_argument("--disable-cuda-graph", action="store_true",
                   help="run draft steps, verify and draft-extend eagerly on CUDA (graphs are on by default there)")
    r.add_argument("--cuda-graph-mode", default="auto", choices=("auto", "off", "static", "cuda"),
                   help="auto: CUDA graphs on CUDA, eager on CPU; static: the CPU stand-in with the same "
                        "buffers and keys (for testing)")
    r.add_argument("--cuda-graph-max-graphs", type=_positive_int, default=64,
                   help="captured graphs kept per scope before the least recently used is dropped (SGLang "
                        "captures every batch size at start and keeps them; raise this when a run visits many "
                        "steps x batch sizes, or re-captures stall it)")
    r.add_argument("--disable-overlap-schedule", action="store_true",
                   help="read each iteration's results before launching the next (default: overlap them)")
    r.add_argument("--enable-torch-compile", action="store_true",
                   help="torch.compile the decode forwards (target layers, draft head) inside the CUDA graphs")
    r.add_argument("--torch-compile-max-bs", type=_positive_int, default=32,
                   help="batches above this run uncompiled (with --enable-torch-compile)")
    r.add_argument("--max-running-requests", type=_positive_int, default=None)
    r.add_argument("--context-length", type=_positive_int, default=None,
                   help="per-request token capacity (prompt + output)")
    r.add_argument("--chunked-prefill-size", type=_chunk_size, default=None,
                   help="most prompt tokens in one prefill batch; longer prompts are prefilled in chunks "
                        "(-1: no chunking; default as SGLang: 8192 on an H200, 4096 without a GPU)")
    r.add_argument("--max-prefill-tokens", type=_positive_int, default=None,
                   help="most prompt tokens in one prefill batch (default 16384, as SGLang)")
    r.add_argument("--emulate-comm-latency", default=None, metavar="A_us[,B_us_per_KB]",
                   help="add an emulated latency to every collective (labelled as emulation)")
    h = p.add_argument_group("http")
    h.add_argument("--host", default="127.0.0.1")
    h.add_argument("--port", type=_port, default=30000)
    h.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (required off loopback; visible in ps: prefer "
                        f"--api-key-file or ${ENV_VAR})")
    h.add_argument("--api-key-file", default=None, metavar="FILE",
                   help=f"read the key from FILE's first line (mode 600); default: ${ENV_VAR}")
    h.add_argument("--restrict-profiling", action="store_true",
                   help="confine /start_profile's output_dir to the trace root and stop a profile without "
                        "num_steps after 200 steps (always so off loopback)")
    h.add_argument("--enable-metrics", action="store_true",
                   help="accepted for SGLang compatibility; /metrics is always on here")
    h.add_argument("--decode-log-interval", type=_nonneg_int, default=40,
                   help="print SGLang's decode log line every N decode iterations (0: never)")
    h.add_argument("--skip-server-warmup", action="store_true")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate_latency(text: str) -> None:
    parts = text.split(",")
    if len(parts) > 2:
        raise OptionsError(f"--emulate-comm-latency: expected A_us[,B_us_per_KB], got {text!r}")
    for part in parts:
        try:
            v = float(part)
        except ValueError:
            raise OptionsError(f"--emulate-comm-latency: {part!r} is not a number") from None
        if v < 0:
            raise OptionsError(f"--emulate-comm-latency: {part!r} must be >= 0")


def _simulate_profile(path: str | None, curve: str | None, steps: int | None,
                      topk: int | None) -> dict[str, Any] | None:
    """The checked profile of --speculative-simulate-accept-profile, refused in one line when it is
    not measured, fails a validation, is a tree profile for a chain, or is shorter than the steps."""
    if path is None:
        return None
    from probes.speculation_profile import ProfileError, read, simulator
    from refengine.config import EngineOptions

    if curve is not None:
        raise OptionsError("--speculative-simulate-accept and --speculative-simulate-accept-profile exclude "
                           "each other")
    try:
        profile = read(path)
        sim = simulator(profile)
    except ProfileError as e:
        raise OptionsError(f"--speculative-simulate-accept-profile: {e}") from None
    defaults = EngineOptions()
    why = sim.refuse(defaults.speculative_num_steps if steps is None else steps,
                     defaults.speculative_eagle_topk if topk is None else topk)
    if why:
        raise OptionsError(f"--speculative-simulate-accept-profile: {why}")
    return profile


def _adaptive(a: argparse.Namespace, algo: str | None, steps: int | None, topk: int | None,
              ndt: int | None) -> tuple[dict[str, dict] | None, int | None]:
    """The checked adaptive config and the starting steps (SGLang's rules: topk 1, the steps one of
    the candidates, by default the middle of the first tier's), refused in one line."""
    if not a.speculative_adaptive:
        if a.speculative_adaptive_config is not None:
            raise OptionsError("--speculative-adaptive-config needs --speculative-adaptive")
        return None, steps
    from probes import adaptive_policy
    if algo == "NONE":
        raise OptionsError("--speculative-adaptive needs a draft model (not --speculative-algorithm NONE)")
    if topk not in (None, 1):
        raise OptionsError(f"--speculative-adaptive needs --speculative-eagle-topk 1 (SGLang's adaptive steps "
                           f"run chains only), got {topk}")
    try:
        tiers = (_read_adaptive_config(a.speculative_adaptive_config) if a.speculative_adaptive_config
                 else adaptive_policy.default_config())
        start = adaptive_policy.initial_steps(tiers, steps)
    except adaptive_policy.AdaptiveConfigError as e:
        flag = "--speculative-adaptive-config" if a.speculative_adaptive_config else "--speculative-num-steps"
        raise OptionsError(f"{flag}: {e}") from None
    if ndt is not None and ndt != start + 1:
        raise OptionsError("--speculative-num-draft-tokens is chosen by --speculative-adaptive (steps + 1 per tier)")
    return adaptive_policy.config_json(tiers), start


def _read_adaptive_config(path: str) -> dict[int, dict]:
    """A config file, through the bounded JSON reader, parsed and resolved (AdaptiveConfigError in one line)."""
    from probes import adaptive_policy
    from probes.json_file import JsonFileError, read_json
    try:
        raw = read_json(path)
    except JsonFileError as e:
        raise adaptive_policy.AdaptiveConfigError(str(e)) from None
    try:
        return adaptive_policy.parse_config(raw)
    except adaptive_policy.AdaptiveConfigError as e:
        raise adaptive_policy.AdaptiveConfigError(f"{path}: {e}") from None


def parse_options(argv: list[str]) -> ServerOptions:
    """Parse `serve` arguments; argparse exits on syntax errors, OptionsError on bad combinations."""
    a = build_parser().parse_args(argv)
    try:
        api_key = resolve_api_key(a.api_key, a.api_key_file)
    except ApiKeyError as e:
        raise OptionsError(str(e)) from None
    algo = a.speculative_algorithm
    if algo == "EAGLE":
        algo = "EAGLE3"
    if algo is not None and algo not in ALGORITHMS:
        raise OptionsError(f"--speculative-algorithm: {algo!r} is not supported here (use EAGLE3 or NONE)")
    if algo is None:
        # This engine exists to run EAGLE-3: speculation is on unless NONE is asked for.
        algo = "EAGLE3"
    if not is_loopback(a.host) and not api_key:
        raise OptionsError(
            f"refusing to listen on {a.host} without --api-key (or --api-key-file FILE, or ${ENV_VAR}): "
            "control and profiling would be open to the network (bind 127.0.0.1, or give a key)")
    if a.emulate_comm_latency is not None:
        _validate_latency(a.emulate_comm_latency)
    from refengine.config import ATTEND_SKIP_HIDDEN_ENV, FUSED_KERNELS_ENV, fused_kernels_from
    try:                       # checked here, so a bad value is one line, not a rank's traceback
        fused_kernels_from(os.environ.get(FUSED_KERNELS_ENV))
    except ValueError as e:
        raise OptionsError(str(e)) from None
    if os.environ.get(ATTEND_SKIP_HIDDEN_ENV, "") not in ("", "0", "1"):
        raise OptionsError(f"${ATTEND_SKIP_HIDDEN_ENV}: expected 1 or 0, got {os.environ[ATTEND_SKIP_HIDDEN_ENV]!r}")
    topk, steps, ndt = a.speculative_eagle_topk, a.speculative_num_steps, a.speculative_num_draft_tokens
    profile = _simulate_profile(a.speculative_simulate_accept_profile, a.speculative_simulate_accept, steps, topk)
    if (topk in (None, 1)) and steps is not None and ndt is not None and ndt != steps + 1:
        raise OptionsError(
            f"--speculative-num-draft-tokens {ndt} contradicts topk=1 with {steps} steps "
            f"(it must be steps+1 = {steps + 1})")
    schedule, steps = _adaptive(a, algo, steps, topk, ndt)
    return ServerOptions(
        speculative_adaptive=a.speculative_adaptive, speculative_adaptive_config=a.speculative_adaptive_config,
        adaptive_schedule=schedule,
        model_path=a.model_path, load_format=a.load_format, served_model_name=a.served_model_name,
        speculative_algorithm=algo, speculative_draft_model_path=a.speculative_draft_model_path,
        speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndt,
        speculative_draft_placement=a.speculative_draft_placement,
        speculative_simulate_accept=a.speculative_simulate_accept,
        speculative_simulate_accept_profile=a.speculative_simulate_accept_profile, simulate_profile=profile,
        speculative_use_rejection_sampling=a.speculative_use_rejection_sampling,
        tp_size=a.tp_size, device=a.device, dtype=a.dtype, host=a.host, port=a.port,
        max_running_requests=a.max_running_requests, context_length=a.context_length, api_key=api_key,
        chunked_prefill_size=a.chunked_prefill_size, max_prefill_tokens=a.max_prefill_tokens,
        restrict_profiling=a.restrict_profiling,
        enable_metrics=True, decode_log_interval=a.decode_log_interval,
        emulate_comm_latency=a.emulate_comm_latency, skip_server_warmup=a.skip_server_warmup,
        disable_cuda_graph=a.disable_cuda_graph, cuda_graph_mode=a.cuda_graph_mode,
        cuda_graph_max_graphs=a.cuda_graph_max_graphs, disable_overlap_schedule=a.disable_overlap_schedule,
        enable_torch_compile=a.enable_torch_compile, torch_compile_max_bs=a.torch_compile_max_bs,
        random_seed=a.random_seed,
        # The key by value too: argparse also takes abbreviations (`--api-ke K`, `--api=K`).
        launch_command=["specdecode-tune", "serve", *key_redact_argv(list(argv), [api_key] if api_key else [])],
    )
