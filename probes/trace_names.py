"""What trace names mean: span name → phase, kernel / CPU-op name → communication or not.

The single place that knows SGLang's span names (reference §7.1), our engine's (`specdecode.*`) and
the collective kernel names (§7.3). Pure functions; must not read files or hold state.
"""

from __future__ import annotations

import re

# The phases of one decode iteration, in display order (design note, "Phases"), prefill first.
from probes.names import ALL_PHASES as PHASES
from probes.names import DRAFT, DRAFT_EXTEND, OTHER, PREFILL, VERIFY, VERIFY_SAMPLE

# Span kinds besides the phases.
CONTAINER = "container"   # one whole iteration (the scheduler's run_batch)
INHERIT = "inherit"       # a draft-model forward: takes the phase of the span around it

_EXACT: dict[str, str] = {
    "draft": DRAFT,
    "draft_extend": DRAFT_EXTEND,
    "verify": VERIFY,  # named in SGLang's docstring; a plugin may emit it (§7.3)
    "specdecode.draft": DRAFT,
    "specdecode.verify": VERIFY,
    "specdecode.verify_sample": VERIFY_SAMPLE,
    "specdecode.draft_extend": DRAFT_EXTEND,
    "specdecode.other": OTHER,
    # Our engine's prefill: the target over the prompt, then the draft over it.
    "specdecode.prefill": PREFILL,
    "specdecode.prefill_draft_extend": PREFILL,
    "scheduler.run_batch": CONTAINER,
    "specdecode.iteration": CONTAINER,
}
_STEP = re.compile(r"^step\[(\w+)")
# step[VERIFY] is the target forward over the draft tokens; step[DECODE] is the target forward of
# plain decode, which our engine also counts as verify (steps = 0); step[DRAFT] is every draft
# forward, in draft or draft-extend alike, so it inherits. step[EXTEND is the target's prefill
# forward (SGLang's prefill batch; its `draft_extend` after it is the draft's prefill, see
# trace_analysis).
_STEP_KIND = {"VERIFY": VERIFY, "TARGET_VERIFY": VERIFY, "DECODE": VERIFY, "DRAFT": INHERIT,
              "EXTEND": PREFILL}

# §7.3: NCCL, custom all-reduce (sgl_kernel v1/v2), FlashInfer PCIe-IPC.
COMM_KERNEL = re.compile(
    r"nccl|allreduce|allgather|reducescatter|all_reduce|all_gather|reduce_scatter"
    r"|cross_device_reduce|pcie_?ipc",
    re.IGNORECASE,
)
# CPU-side collectives: our communicator's spans, c10d ops, gloo annotations, SGLang's custom ops.
COMM_CPU = re.compile(
    r"^specdecode\.comm\.|^c10d::|^gloo:|^nccl:|^record_param_comms$"
    r"|^sglang::(outplace_|inplace_)?all_reduce|^sglang::reg_(all_gather|reduce_scatter)"
)


def span_kind(name: str) -> str | None:
    """The phase (or CONTAINER / INHERIT) a user_annotation span stands for, or None."""
    kind = _EXACT.get(name)
    if kind is not None:
        return kind
    m = _STEP.match(name)
    if m:
        return _STEP_KIND.get(m.group(1))
    return None


# The all-reduces among them (NCCL's AllReduce kernels, custom all-reduce, PCIe-IPC; our engine's
# and c10d's all_reduce spans): what an all-reduce backend such as PCIe-IPC can take over.
ALL_REDUCE = re.compile(r"allreduce|all_reduce|cross_device_reduce|pcie_?ipc", re.IGNORECASE)


def is_comm_kernel(name: str) -> bool:
    return COMM_KERNEL.search(name) is not None


def is_all_reduce(name: str) -> bool:
    return ALL_REDUCE.search(name) is not None


def is_comm_cpu(name: str) -> bool:
    return COMM_CPU.search(name) is not None


def is_anchor(name: str) -> bool:
    """Spans that start an iteration and align ranks: the n-th `draft` is iteration n everywhere."""
    return name == "draft" or name == "specdecode.draft"
