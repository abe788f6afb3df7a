"""Series names: scope/metric_unit, one table of the names the core produces.

Names carry their scope and unit (``gpu0/power_w``, ``phase/draft_ms``) so a reader never needs a
side table to label an axis. This module only names things; it must not compute readings.
"""

from __future__ import annotations

# The phases of one decode iteration (docs/protocol.md, the phase record), in iteration order, prefill first.
from probes.names import ALL_PHASES as PHASES

SERVER_TOK_PER_S = "server/tok_per_s"            # decode tok/s: rate of realtime_tokens_total{mode=decode}
SERVER_GEN_THROUGHPUT = "server/gen_throughput_tok_per_s"  # sglang:gen_throughput (log-window gauge)
SERVER_RUNNING = "server/running_reqs"
SERVER_QUEUED = "server/queue_reqs"
SERVER_ITER_PER_S = "server/iter_per_s"          # decode iterations per second (phase stream)
SERVER_ITERATIONS = "server/iterations_total"    # iterations seen by this session (phase stream)
SERVER_BATCH = "server/batch_size"               # mean running batch per iteration (phase stream)

SPEC_ACCEPT_LEN = "spec/accept_len"              # tau: accepted drafts + bonus per verify
SPEC_ACCEPT_RATE = "spec/accept_rate"            # correct drafts / (verifies x (num_draft_tokens - 1))
SPEC_NUM_STEPS = "spec/num_steps"
SPEC_TOPK = "spec/topk"
SPEC_NUM_DRAFT_TOKENS = "spec/num_draft_tokens"
SPEC_VERIFIES = "spec/verifies"                  # request-verifies in the reading's interval

LOAD_TOK_PER_S = "load/tok_per_s"                # client-side: output_ids counted by the load driver
LOAD_INFLIGHT = "load/inflight"
LOAD_REQUESTS = "load/requests_total"
LOAD_ERRORS = "load/errors_total"
LOAD_BACKLOG = "load/backlog"                    # open loop: arrivals waiting for a free slot

# SGLang's own log lines, read by managed mode (tuner.backends.sglang.log): kept apart from the same
# readings taken from /metrics so a chart or a report always knows its source.
LOG_GEN_THROUGHPUT = "log/gen_throughput_tok_per_s"   # "gen throughput (token/s)" of a decode line
LOG_ACCEPT_LEN = "log/accept_len"                # "accept len" of a decode line
LOG_RUNNING = "log/running_reqs"                 # "#running-req" of a decode line
LOG_TIER_STEPS = "log/tier_steps"                # steps of the adaptive tier after a switch line

PHASE_WALL_MS = "phase/wall_ms"                  # wall time per iteration (rank 0)
PHASE_IDLE_MS = "phase/idle_ms"                  # wall - union of the phases


def accept_pos(k: int) -> str:
    """p_k: probability that draft position k (1-based) was accepted (unconditional)."""
    return f"spec/accept_pos/{k}"


def accept_cond(k: int) -> str:
    """alpha_k = p_k / p_(k-1): acceptance of position k given k-1 was accepted."""
    return f"spec/accept_cond/{k}"


def bucket_verifies(bucket: str) -> str:
    """Request-verifies in one acceptance bucket (probes.accept_buckets: bs8, ctx512, ...)."""
    return f"spec/{bucket}/verifies"


def bucket_accept_pos(bucket: str, k: int) -> str:
    """p_k within one acceptance bucket; with bucket_verifies it gives the bucket's counts back."""
    return f"spec/{bucket}/accept_pos/{k}"


def phase_ms(phase: str) -> str:
    """Inclusive ms per iteration spent in a phase."""
    return f"phase/{phase}_ms"


def phase_comm_ms(phase: str) -> str:
    """The part of phase_ms(phase) spent in collectives (all of them). Never stack it on phase_ms."""
    return f"phase/{phase}_comm_ms"


def phase_share_pct(phase: str) -> str:
    """Share of wall time in a phase, when only busy seconds are known (no iteration count)."""
    return f"phase/{phase}_share_pct"


def gpu(index: int, metric: str) -> str:
    """A per-GPU reading, e.g. gpu(0, "power_w") -> "gpu0/power_w" (NVML sampler's names)."""
    return f"gpu{index}/{metric}"


def unit_of(series: str) -> str:
    """The unit suffix of a series name ("ms", "pct", "tok_per_s", ...) or "" for plain numbers."""
    leaf = series.rsplit("/", 1)[-1]
    for unit in ("tok_per_s", "iter_per_s", "ms", "pct", "w", "mhz", "gb", "mib", "c", "total", "s"):
        if leaf == unit or leaf.endswith("_" + unit):
            return unit
    return ""
