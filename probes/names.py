"""The names every part shares: phases, placements, phase-record keys, knob server-arg names, and
the draft tree's size bound.

The engine writes these names, the in-server probes write them too, and the tuner reads them; one
spelling here keeps the three from drifting apart. Standard library only (an import-linter
contract checks it), so the engine, an SGLang server and the operator side can all import it.
Must not hold behaviour beyond the tree bound: no parsing, no labels, no I/O.
"""

from __future__ import annotations

# -- phases of one decode iteration (the phase stream's phase_ms / comm_ms / comm_calls keys) -----
DRAFT = "draft"
VERIFY = "verify"
VERIFY_SAMPLE = "verify_sample"
"""Accept + commit: the verify call minus the target forward."""
DRAFT_EXTEND = "draft_extend"
OTHER = "other"
"""Wall time minus the named phases."""
PREFILL = "prefill"
"""Prefilling requests admitted since the previous record (the SGLang plugin reports 0 for now)."""

DECODE_PHASES: tuple[str, ...] = (DRAFT, VERIFY, VERIFY_SAMPLE, DRAFT_EXTEND, OTHER)
"""The phases of the decode iteration itself, in display order."""
ALL_PHASES: tuple[str, ...] = (PREFILL, *DECODE_PHASES)
"""Every phase a record carries, prefill first (it runs before the iteration it is counted in).
Older recordings lack prefill: readers take a missing phase as 0 or absent, never an error."""

# -- where the draft runs ----------------------------------------------------------------------
SHARDED = "sharded"
"""On the target's TP group, sharded like the target."""
REPLICATED = "replicated"
"""A full copy on every rank: no draft collectives."""
RANK0 = "rank0"
"""A full copy on rank 0 only; the others wait for its tokens."""
PLACEMENTS: tuple[str, ...] = (SHARDED, REPLICATED, RANK0)

# -- the knobs, by their server-arg names (SGLang's, plus our placement) -----------------------
STEPS = "speculative_num_steps"
TOPK = "speculative_eagle_topk"
DRAFT_TOKENS = "speculative_num_draft_tokens"
PLACEMENT = "speculative_draft_placement"
ACCEPT_THRESHOLD_SINGLE = "speculative_accept_threshold_single"
"""SGLang's relaxed acceptance threshold (live through its own /set_internal_state; not our engine's)."""
KNOBS: tuple[str, ...] = (STEPS, TOPK, DRAFT_TOKENS, PLACEMENT, ACCEPT_THRESHOLD_SINGLE)
PINNED_STEPS = "specdecode_num_steps"
"""The SGLang plugin's name for steps (it pins the adaptive tier; -1 unpins)."""
ALLREDUCE_PATHS = "specdecode_allreduce"
"""SGLang plugin, in `internal_states[i]`: the tp group's communicators and the all-reduce path a
decode-sized call takes at each captured batch size (probes/inserver/sglang_comm.allreduce_report)."""
COLLECTIVES = "specdecode_collectives"
"""SGLang plugin, in `internal_states[i]`: all-reduces and all-gathers per draft and target forward,
computed from the module trees (sglang_comm.collectives_per_forward)."""
PINNABLE_STEPS = "specdecode_pinnable_steps"
"""What the SGLang plugin publishes in `internal_states[i]`: the tiers it can pin and the batch
sizes where each holds (probes/inserver/sglang_steps.pinnable_info)."""
ENGINE_KNOBS = "specdecode_knobs"
"""Our engine, in `internal_states[0]`: the knobs (of KNOBS) it supports; it refuses the others by name."""
ADAPTIVE = "speculative_adaptive"
ADAPTIVE_CONFIG = "speculative_adaptive_config"
"""SGLang's adaptive switch and its config (a file at launch; the config in force in internal_states)."""

# -- keys of one phase-stream record (GET /specdecode/phases) ---------------------------------
R_SEQ = "seq"
R_T = "t"
R_RANK = "rank"
R_EPOCH = "epoch"
R_STEPS = "steps"
R_TOPK = "topk"
R_DRAFT_TOKENS = "num_draft_tokens"
R_PLACEMENT = "placement"
R_ACCEPT_THRESHOLD_SINGLE = "accept_threshold_single"
"""A knob's key in a setting's JSON; no writer puts it in a record yet (SGLang keeps the threshold
in its server-args context, which the plugin does not read), so it is not in RECORD_KEYS."""
R_BS = "bs"
R_COMMITTED = "committed"
R_WALL_MS = "wall_ms"
R_PHASE_MS = "phase_ms"
R_COMM_MS = "comm_ms"
R_COMM_CALLS = "comm_calls"
R_COMM_CALLS_IN_GRAPH = "comm_calls_in_graph"
R_ACCEPTED = "accepted"
R_CTX = "ctx"
"""Each request's context length (tokens in its KV before this iteration's commit), aligned with
`accepted`; from host-side lengths, never a device read. Older recordings and servers lack it."""
R_T_LAUNCH = "t_launch"
"""Wall-clock seconds when the record's iteration was launched (its command and prefills included).
With the overlap scheduler the iteration's host spans start here, not at `t - wall_ms`: the next
iteration is launched before this one is read. What a trace is matched on."""
R_ADAPTIVE = "adaptive"
"""Whether an adaptive schedule chose this record's steps (they are what actually ran either way)."""
R_PINNED = "pinned"
"""SGLang plugin: a step pin is set and held at this batch size (false: the pin is set but this
batch size's slot has no graphs for the tier, so SGLang's policy ran). Absent without a pin."""
R_SIMULATED = "simulated"
R_EMULATED_COMM = "emulated_comm"
R_GRAPH_MODE = "graph_mode"
R_CAPTURE = "capture"
R_CAPTURES = "captures"
KNOB_RECORD_KEYS: dict[str, str] = {
    STEPS: R_STEPS, TOPK: R_TOPK, DRAFT_TOKENS: R_DRAFT_TOKENS, PLACEMENT: R_PLACEMENT,
    ACCEPT_THRESHOLD_SINGLE: R_ACCEPT_THRESHOLD_SINGLE,
}
"""Each knob's server-arg name -> its key in a record (and a setting's JSON), in KNOBS order: what a
record writer puts a knob under, and what its config epoch is made of."""
RECORD_KEYS: frozenset[str] = frozenset({
    R_SEQ, R_T, R_RANK, R_EPOCH, R_STEPS, R_TOPK, R_DRAFT_TOKENS, R_PLACEMENT, R_BS, R_COMMITTED,
    R_WALL_MS, R_PHASE_MS, R_COMM_MS, R_COMM_CALLS, R_COMM_CALLS_IN_GRAPH, R_ACCEPTED, R_CTX, R_ADAPTIVE, R_PINNED,
    R_SIMULATED,
    R_T_LAUNCH,
    R_EMULATED_COMM, R_GRAPH_MODE, R_CAPTURE, R_CAPTURES,
})
"""Every key a record may carry; unknown fields are left out, never null."""


# -- the draft tree's size bound ---------------------------------------------------------------
def tree_pool(steps: int, topk: int) -> int:
    """The candidate pool of an EAGLE tree: topk at the first step, topk² at each later one."""
    return topk + (steps - 1) * topk * topk


def tree_fits(steps: int, topk: int, num_draft_tokens: int) -> bool:
    """Whether N draft tokens (the root included) fit the tree: N − 1 ≤ topk + (steps − 1)·topk²."""
    return num_draft_tokens - 1 <= tree_pool(steps, topk)
