"""Engine options and the live speculative configuration, validated as one resulting config.

Pure Python (no torch): the HTTP process validates a /set_internal_state body with
`resolve_config` before anything reaches the ranks, and the ranks apply only resolved configs.
Must not import torch or start anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from probes import adaptive_policy
from probes.adaptive_policy import AdaptiveConfigError
from probes.names import (ADAPTIVE_CONFIG, DRAFT_TOKENS, PINNED_STEPS, PLACEMENT, PLACEMENTS, R_DRAFT_TOKENS,
                          R_PLACEMENT, R_STEPS, R_TOPK, SHARDED, STEPS, TOPK, tree_pool)

# The fused kernels of refengine.models.fused_ops. All on by default (measured faster in the engine's
# forward on an H200: benchmarks/results/fused_kernels_h200.md); the environment picks them for a
# whole engine (ranks included), so a benchmark can run it with and without them side by side.
FUSED_KERNELS = ("silu_mul", "add_rms_norm", "rope_store")
FUSED_KERNELS_ENV = "SPECDECODE_FUSED_KERNELS"
# refengine.models.triton_attend.SKIP_HIDDEN for a whole engine: "1" on, "0" or unset off (measured
# slower in the engine's forward, so off).
ATTEND_SKIP_HIDDEN_ENV = "SPECDECODE_ATTEND_SKIP_HIDDEN"


def fused_kernels_from(text: str | None) -> set[str]:
    """`silu_mul,rope_store`, `all`, or `none` / empty: the kernels named; None (the variable unset):
    all of them; ValueError (one line) for other names."""
    if text is None:
        return set(FUSED_KERNELS)
    names = {n.strip() for n in text.split(",") if n.strip()}
    if names == {"all"}:
        return set(FUSED_KERNELS)
    if names == {"none"}:
        return set()
    unknown = sorted(names - set(FUSED_KERNELS))
    if unknown:
        raise ValueError(f"${FUSED_KERNELS_ENV}: unknown kernel(s) {', '.join(unknown)}; "
                         f"known: {', '.join(FUSED_KERNELS)}, all or none")
    return names


# The knobs this engine supports, a subset of probes.names.KNOBS (a knob may exist for SGLang
# alone: the server refuses it by name), by /set_internal_state key -> SpecConfig field (which is
# the phase record's key).
CONFIG_KEYS = {
    STEPS: R_STEPS,
    TOPK: R_TOPK,
    DRAFT_TOKENS: R_DRAFT_TOKENS,
    PLACEMENT: R_PLACEMENT,
}
# Everything /set_internal_state sets: the knobs, SGLang's adaptive config and the SGLang plugin's pin.
SETTABLE_KEYS = {**CONFIG_KEYS, ADAPTIVE_CONFIG: "adaptive", PINNED_STEPS: "pinned"}


class ConfigError(ValueError):
    """An invalid configuration or change; the message is one line saying why."""


@dataclass(frozen=True)
class SpecConfig:
    """The live speculative configuration. `epoch` increases with every applied change."""

    steps: int = 3
    """Draft forwards per cycle (0 = SGLang's tier 0: a one-token verify plus a draft-extend, so
    the draft stays warm)."""
    topk: int = 1
    """Branching factor of the draft tree (1 = chain)."""
    num_draft_tokens: int = 4
    """Tokens verified per request per cycle, the root included (steps + 1 for a chain)."""
    placement: str = SHARDED
    """Where the draft runs: on the target's TP group, replicated on every rank, or on rank 0."""
    epoch: int = 0
    adaptive: dict[str, dict] | None = None
    """SGLang's adaptive schedule in force (probes.adaptive_policy.config_json), or None: a fixed
    setting. With one, the engine picks each iteration's steps from its batch size; `steps` is the
    step every tier starts from, and the fixed setting that removing the schedule returns to."""
    pinned: int | None = None
    """The tier pinned by `specdecode_num_steps` (None: the policy chooses)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModelLimits:
    """What validation needs to know about the loaded models (sent by rank 0 when ready)."""

    tp_size: int = 1
    draft_heads: int = 1
    draft_kv_heads: int = 1
    has_draft: bool = True
    max_topk: int = 8
    max_draft_tokens: int = 64


def resolve_config(current: SpecConfig, changes: dict[str, Any], limits: ModelLimits) -> SpecConfig:
    """Apply `changes` (keys of CONFIG_KEYS) to `current` and validate the result as one config.

    topk = 1 derives num_draft_tokens = steps + 1 unless it is given explicitly, in which case a
    different value is refused; topk > 1 keeps num_draft_tokens unless given, and it must satisfy
    SGLang's candidate-pool bound N - 1 <= topk + (steps - 1) * topk^2.

    Raises:
        ConfigError: unknown key, wrong type or an invalid resulting configuration.
    """
    fields: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in SETTABLE_KEYS:
            raise ConfigError(f"unknown key {key!r}; settable: {', '.join(SETTABLE_KEYS)}")
        name = SETTABLE_KEYS[key]
        if name == "adaptive":
            if value is not None:
                try:
                    value = adaptive_policy.config_json(adaptive_policy.parse_config(value))
                except AdaptiveConfigError as e:
                    raise ConfigError(f"{key}: {e}") from None
        elif name == "placement":
            if value not in PLACEMENTS:
                raise ConfigError(f"{key} must be one of {', '.join(PLACEMENTS)}, got {value!r}")
        else:
            # SGLang's endpoint sends numbers as int or float; accept 3.0 but not 3.5 or "3".
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                raise ConfigError(f"{key} must be an integer, got {value!r}")
            value = int(value)
        fields[name] = value
    adaptive = fields.get("adaptive", current.adaptive)
    pinned = fields.get("pinned", current.pinned if adaptive == current.adaptive else None)
    if adaptive is not None:
        fields, pinned = _adaptive_fields(current, fields, adaptive, limits), fields.get("pinned", pinned)
        if pinned is not None:
            try:
                pinned = adaptive_policy.check_pin(pinned, _tiers(adaptive))
            except AdaptiveConfigError as e:
                raise ConfigError(str(e)) from None
    elif "pinned" in fields and fields["pinned"] != adaptive_policy.UNPIN:
        raise ConfigError(f"{PINNED_STEPS} pins the tier of an adaptive schedule, and this server runs a fixed "
                          f"setting: set {STEPS}, or install one with {ADAPTIVE_CONFIG}")
    else:
        pinned = None
    steps = fields.get("steps", current.steps)
    topk = fields.get("topk", current.topk)
    placement = fields.get("placement", current.placement)
    if steps < 0:
        raise ConfigError(f"speculative_num_steps must be >= 0, got {steps}")
    if topk < 1:
        raise ConfigError(f"speculative_eagle_topk must be >= 1, got {topk}")
    if steps > 0 and not limits.has_draft:
        raise ConfigError("speculation is off on this server (--speculative-algorithm NONE, no draft "
                          "model): speculative_num_steps cannot be turned on live; relaunch with "
                          "--speculative-algorithm EAGLE3")
    if topk > limits.max_topk:
        raise ConfigError(f"speculative_eagle_topk {topk} exceeds this engine's maximum {limits.max_topk}")
    if topk == 1:
        n = steps + 1
        if R_DRAFT_TOKENS in fields and fields[R_DRAFT_TOKENS] != n:
            raise ConfigError(
                f"with speculative_eagle_topk 1, speculative_num_draft_tokens must be steps + 1 = {n}, "
                f"got {fields['num_draft_tokens']}")
    elif steps == 0:
        n = 1
    else:
        n = fields.get(R_DRAFT_TOKENS, current.num_draft_tokens if current.topk > 1 else None)
        if n is None:
            n = min(tree_pool(steps, topk), limits.max_draft_tokens - 1) + 1
        pool = tree_pool(steps, topk)
        if n < 2 or n - 1 > pool:
            raise ConfigError(
                f"speculative_num_draft_tokens {n} is invalid for steps {steps}, topk {topk}: "
                f"need 2 <= N and N - 1 <= topk + (steps - 1) * topk^2 = {pool}")
    if steps > 1 and (steps - 1) * topk > limits.max_draft_tokens:
        raise ConfigError(f"steps {steps} x topk {topk} needs {(steps - 1) * topk} scratch draft slots; "
                          f"this engine has {limits.max_draft_tokens}")
    if n > limits.max_draft_tokens:
        raise ConfigError(f"speculative_num_draft_tokens {n} exceeds this engine's maximum {limits.max_draft_tokens}")
    if placement == SHARDED and limits.tp_size > 1 and limits.has_draft:   # no draft: nothing to shard
        if limits.draft_heads % limits.tp_size or limits.draft_kv_heads % limits.tp_size:
            raise ConfigError(
                f"placement sharded needs the draft's heads ({limits.draft_heads}) and KV heads "
                f"({limits.draft_kv_heads}) divisible by tp_size {limits.tp_size}")
    new = replace(current, steps=steps, topk=topk, num_draft_tokens=n, placement=placement, adaptive=adaptive,
                  pinned=pinned)
    if new == current:
        return current
    return replace(new, epoch=current.epoch + 1)


def _tiers(adaptive: dict[str, dict]) -> dict[int, dict]:
    return {int(k): v for k, v in adaptive.items()}


def _adaptive_fields(current: SpecConfig, fields: dict[str, Any], adaptive: dict[str, dict],
                     limits: ModelLimits) -> dict[str, Any]:
    """The fixed knobs under an adaptive schedule, as SGLang allows them: steps and draft tokens are
    the controller's (the pin is `specdecode_num_steps`), topk is 1, and the starting step is one of
    the candidates (the current steps when it is one, else the middle of the first tier's)."""
    if "steps" in fields or R_DRAFT_TOKENS in fields:
        key = STEPS if "steps" in fields else DRAFT_TOKENS
        raise ConfigError(f"{key} is chosen by the adaptive schedule on this server: pin a tier with "
                          f"{PINNED_STEPS} (-1 unpins), or remove the schedule with {ADAPTIVE_CONFIG}: null")
    topk = fields.get("topk", 1 if "adaptive" in fields else current.topk)
    if topk != 1:
        raise ConfigError(f"speculative_adaptive needs {TOPK} 1 (SGLang's adaptive steps run chains only), "
                          f"got {topk}")
    if not limits.has_draft:
        raise ConfigError("speculative_adaptive needs a draft model (this server runs --speculative-algorithm NONE)")
    tiers = _tiers(adaptive)
    steps = current.steps if current.steps in adaptive_policy.all_candidates(tiers) else \
        adaptive_policy.initial_steps(tiers, None)
    return {**fields, "steps": steps, "topk": 1}


@dataclass(frozen=True)
class EngineOptions:
    """Everything needed to start the ranks. Field names follow SGLang's server args."""

    model_path: str = "tiny-agreeing"
    """An HF Llama directory, or a preset name (see refengine.presets) with load_format dummy."""
    speculative_draft_model_path: str | None = None
    """An EAGLE-3 head directory or preset; None = the preset's matching head (or no draft)."""
    load_format: str = "auto"
    """auto (read files) | dummy (random or constructed weights for a preset name)."""
    tp_size: int = 1
    device: str = "cpu"
    """cpu (gloo) or cuda (NCCL, rank r on cuda:r)."""
    dtype: str = "auto"
    """auto = float32 on CPU, bfloat16 on CUDA; or float32, float16, bfloat16, float64."""
    speculative_algorithm: str = "EAGLE3"
    """EAGLE3 (a draft model is loaded; steps 0 is tier 0) or NONE (no draft: plain decoding,
    the no-speculation baseline; speculation cannot be turned on live)."""
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int | None = None
    speculative_draft_placement: str = SHARDED
    speculative_simulate_accept: str | None = None
    """Force acceptance: a mean accept length "2.5" or a per-position curve "0.8,0.6,0.4"."""
    speculative_simulate_accept_profile: dict[str, Any] | None = None
    """Force acceptance from a checked speculation_profile.json (probes.speculation_profile)."""
    speculative_adaptive_config: dict[str, dict] | None = None
    """SGLang's adaptive schedule (probes.adaptive_policy.config_json), checked; None = fixed steps.
    `speculative_num_steps` is then the step every tier starts from."""
    speculative_use_rejection_sampling: bool = False
    """topk = 1 at temperature > 0: sample the chain from q and accept with min(1, p/q) (SGLang's
    --speculative-use-rejection-sampling) instead of target-only sampling."""
    emulate_comm_latency: str | None = None
    """"A_us[,B_us_per_KB]": sleep this long after every collective (labelled as emulation)."""
    max_running_requests: int = 8
    chunked_prefill_size: int | None = None
    """Most prompt tokens in one prefill batch; a longer prompt is prefilled in chunks. -1 = no
    chunking; None = SGLang 0.5.23's default for the device (arg_groups/memory_hook.py: 8192 on
    an H200, :147-153; 4096 without a GPU, :172-177)."""
    max_prefill_tokens: int = 16384
    """Most prompt tokens in one prefill batch besides the chunk size (SGLang's default,
    arg_groups/fields/schedule.py:71-81)."""
    context_length: int = 1024
    """Per-request KV capacity in tokens (prompt + output + one verify window)."""
    random_seed: int = 0
    threads_per_rank: int | None = None
    """CPU threads per rank; None = cores / tp_size (at least 1)."""
    init_timeout_s: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the ranks (the parent's environment, NCCL_* included, is inherited)."""
    cuda_graph: str = "auto"
    """Graph capture of draft steps, verify and draft-extend (refengine.graphs): auto (cuda on a
    CUDA device, off on CPU), off, cuda, or static (the CPU stand-in with the same buffers and keys)."""
    cuda_graph_max_graphs: int = 64
    """Captured graphs kept per scope before the least recently used is dropped."""
    cuda_graph_timing: bool = False
    """CUDA events around every replay, reported per graph key in stats (benchmarks)."""
    cuda_graph_log: bool = True
    """Rank 0 prints one line per capture (they are in the phase records either way)."""
    disable_overlap_schedule: bool = False
    """Read each iteration's results before launching the next (SGLang's switch; by default the
    next iteration is launched first, so host work hides behind the GPU: refengine.engine)."""
    enable_torch_compile: bool = False
    """torch.compile the target's layers and the draft head (refengine.compiled; SGLang's switch)."""
    torch_compile_max_bs: int = 32
    """Batches above this run the layers uncompiled (SGLang's --torch-compile-max-bs)."""
    torch_compile_mode: str = "auto"
    """Inductor mode: default or max-autotune-no-cudagraphs (CUDA graphs are refengine.graphs'); auto =
    SGLang's choice: $SGLANG_TORCH_COMPILE_MODE if set, else max-autotune-no-cudagraphs on CUDA (its GEMM autotuning was worth 5 % of batch-1
    decode on the H200: benchmarks/results/overlap_h200.json, run decode_roofline_h200_overlap_autotune) and default on CPU."""
    torch_compile_backend: str = "inductor"
    """inductor, or aot_eager: traced and checked like inductor but no code generated (CPU tests)."""

    def initial_config(self) -> dict[str, Any]:
        changes: dict[str, Any] = {
            STEPS: self.speculative_num_steps,
            TOPK: self.speculative_eagle_topk,
            PLACEMENT: self.speculative_draft_placement,
        }
        if self.speculative_adaptive_config is not None:
            # The steps are the schedule's: the starting one travels in the base config.
            return {PLACEMENT: self.speculative_draft_placement, ADAPTIVE_CONFIG: self.speculative_adaptive_config}
        if self.speculative_num_draft_tokens is not None:
            changes[DRAFT_TOKENS] = self.speculative_num_draft_tokens
        return changes

    def chunk_size(self) -> int:
        """chunked_prefill_size resolved as SGLang does (-1: no chunking)."""
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        return 8192 if self.device.startswith("cuda") else 4096


def parse_latency(spec: str | None) -> tuple[float, float] | None:
    """Parse `A_us[,B_us_per_KB]` into (A, B) microseconds; None when off."""
    if not spec:
        return None
    parts = spec.split(",")
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(f"emulate_comm_latency must be 'A_us[,B_us_per_KB]', got {spec!r}") from None
    if len(vals) not in (1, 2) or any(v < 0 for v in vals):
        raise ConfigError(f"emulate_comm_latency must be 'A_us[,B_us_per_KB]' with A, B >= 0, got {spec!r}")
    return vals[0], vals[1] if len(vals) == 2 else 0.0


@dataclass(frozen=True)
class SimulateAccept:
    """The acceptance simulator (SGLang's SGLANG_SIMULATE_ACC_LEN, as a launch option).

    `tau` set: a mean accept length τ (bonus included); per iteration with s steps an i.i.d.
    conditional acceptance α is used such that (1 - α^(s+1)) / (1 - α) = min(τ, s + 1).
    `curve` set: conditional acceptance α_k per draft position k (the last value repeats).
    """

    spec: str
    tau: float | None = None
    curve: tuple[float, ...] = ()

    def alphas(self, steps: int) -> list[float]:
        if self.tau is None:
            return [self.curve[min(i, len(self.curve) - 1)] for i in range(steps)]
        target = min(self.tau, steps + 1.0)
        lo, hi = 0.0, 1.0
        for _ in range(60):   # τ(α) is increasing in α: bisection
            mid = (lo + hi) / 2
            tau = sum(mid ** i for i in range(steps + 1))
            lo, hi = (mid, hi) if tau < target else (lo, mid)
        return [hi] * steps


def parse_simulate_accept(spec: str | None) -> SimulateAccept | None:
    """Parse `--speculative-simulate-accept`: a mean accept length ("2.5", >= 1) or a curve of
    conditional acceptance per position ("0.8,0.6,0.4", each in [0, 1]). None = off."""
    if not spec:
        return None
    try:
        vals = [float(p) for p in spec.split(",")]
    except ValueError:
        raise ConfigError(f"speculative_simulate_accept must be a mean accept length or a list of "
                          f"probabilities, got {spec!r}") from None
    if len(vals) == 1 and vals[0] >= 1.0:
        return SimulateAccept(spec, tau=vals[0])
    if any(not 0.0 <= v <= 1.0 for v in vals):
        raise ConfigError(f"speculative_simulate_accept: a curve needs values in [0, 1], got {spec!r}")
    return SimulateAccept(spec, curve=tuple(vals))


def simulator(opts: EngineOptions) -> SimulateAccept | Any:
    """The engine's acceptance simulator: from a profile, from --speculative-simulate-accept, or
    None (off). Both kinds answer alphas(steps); a profile also says which settings it refuses."""
    if opts.speculative_simulate_accept_profile is not None:
        from probes.speculation_profile import ProfileError, simulator as profile_simulator
        try:
            return profile_simulator(opts.speculative_simulate_accept_profile)
        except ProfileError as e:
            raise ConfigError(f"speculative_simulate_accept_profile: {e}") from None
    return parse_simulate_accept(opts.speculative_simulate_accept)


def refuse_for_simulator(sim: Any, cfg: SpecConfig) -> None:
    """Raise ConfigError when the simulator cannot drive `cfg` (a profile: a tree profile for a
    chain, or steps beyond its max_supported_k); checked before a change reaches the ranks."""
    if not hasattr(sim, "refuse"):
        return
    # Under an adaptive schedule every candidate step may run.
    steps = adaptive_policy.all_candidates(_tiers(cfg.adaptive)) if cfg.adaptive is not None else [cfg.steps]
    for s in steps:
        why = sim.refuse(s, cfg.topk)
        if why:
            raise ConfigError(why)
