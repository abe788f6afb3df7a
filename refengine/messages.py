"""Plain, picklable records that cross process boundaries: requests in, updates out, and one type
per message on the client <-> rank queues (matched by type at both ends, never by tuple position).

These travel over multiprocessing queues between the HTTP process and the ranks, so they hold only
Python scalars, lists and dicts. Must not import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

_INT64_MAX = 2**63 - 1


MAX_SIMULATE_POSITIONS = 64
"""The longest per-request acceptance curve (a deeper chain repeats its last value)."""


@dataclass
class GenRequest:
    """One generation request, already tokenized."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int = 128
    temperature: float = 0.0
    """0 = greedy. > 0 samples (speculative: target-only tree sampling / chain rejection sampling)."""
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop ids besides the model's EOS ids."""
    ignore_eos: bool = False
    seed: int | None = None
    """Seed of this request's sampling coins (None = derived from the engine seed and rid)."""
    simulate_accept: tuple[float, ...] = ()
    """This request's conditional acceptance per draft position (the last value repeats), for an
    engine launched with the acceptance simulator: a workload whose acceptance differs by request
    (code against chat). Empty: the launch's simulator decides."""

    def problem(self, vocab_size: int) -> str | None:
        """Why a rank cannot pack this request's parameters into its tensors and generators, or None.

        The HTTP server bounds every field at parse time; this is the rank's own check, so a
        request from any other caller fails alone (an error update) instead of raising inside the
        rank, which would end the whole group. Pure and cheap: the same answer on every rank."""
        def is_int(v: Any, lo: int, hi: int) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not all(is_int(i, 0, vocab_size - 1) for i in self.input_ids):
            return f"input_ids: expected token ids in 0..{vocab_size - 1}"
        if not is_int(self.max_new_tokens, 0, _INT64_MAX):
            return f"max_new_tokens: expected an integer in 0..{_INT64_MAX}"
        if not is_num(self.temperature) or self.temperature < 0:
            return "temperature: expected a finite number >= 0"
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            return "top_p: expected a number in (0, 1]"
        if not is_int(self.top_k, -1, _INT64_MAX):
            return f"top_k: expected -1 (off) or an integer in 0..{_INT64_MAX}"
        if not all(is_int(i, -_INT64_MAX - 1, _INT64_MAX) for i in self.stop_token_ids):
            return "stop_token_ids: expected integers within int64"
        # The draft's generator takes seed + 1: both must fit a generator's unsigned 64 bits.
        if self.seed is not None and not is_int(self.seed, 0, 2**64 - 2):
            return "seed: expected an integer in 0..2^64-2"
        if len(self.simulate_accept) > MAX_SIMULATE_POSITIONS or not all(
                is_num(a) and 0 <= a <= 1 for a in self.simulate_accept):
            return f"simulate_accept: expected at most {MAX_SIMULATE_POSITIONS} probabilities in [0, 1]"
        return None


@dataclass
class SpecStats:
    """Per-request speculative statistics, as SGLang's meta_info reports them."""

    spec_verify_ct: int = 0
    """Verify rounds (target forwards over draft tokens) this request took part in."""
    spec_num_correct_drafts: int = 0
    spec_num_proposed_drafts: int = 0
    """Σ over verify rounds of (N - 1), N = the draft tokens that round ran (0 at tier 0)."""
    spec_correct_drafts_histogram: list[int] = field(default_factory=list)
    """h[k] = verify rounds that accepted exactly k drafts."""


@dataclass
class GenUpdate:
    """New tokens for one request; the final update has finished=True and the statistics."""

    rid: str
    token_ids: list[int]
    """Tokens generated since the previous update (may be empty on the final update)."""
    finished: bool = False
    finish_reason: str | None = None
    """"stop" (EOS or a stop id: `matched` holds it), "length", "abort", or "error"."""
    matched: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spec: SpecStats | None = None
    """The request's statistics so far, on every update (None without a draft model)."""
    error: str | None = None
    forward_entry: float | None = None
    """On the update with the first token: when its first prefill forward began (epoch seconds;
    the server's queue time is this minus the request's arrival)."""


# -- the queues between the client (HTTP process) and the ranks -------------------------------------
#
# One small type per message, so the two ends cannot disagree on a tuple's layout; both match on
# the type. Client -> rank 0 (the command queue):

@dataclass
class Submit:
    req: GenRequest


@dataclass
class Abort:
    rid: str


@dataclass
class SetConfig:
    config: Any
    """A refengine.config.SpecConfig with its epoch."""


@dataclass
class ProfileStart:
    args: dict


@dataclass
class ProfileStop:
    pass


@dataclass
class Shutdown:
    pass


# Ranks -> client (the output queue):

@dataclass
class Ready:
    rank: int
    info: dict


@dataclass
class RankError:
    rank: int
    traceback: str


@dataclass
class ConfigApplied:
    rank: int
    epoch: int


@dataclass
class PhaseRecord:
    record: dict
    """One iteration's phase record (rank 0 only; readme "The phase stream")."""


@dataclass
class Updates:
    updates: list[GenUpdate]
    """One iteration's updates (rank 0 only), in one message: at batch 64 a message per request
    was 64 pickles a step through the queue's feeder thread, which shares the rank's GIL, and as
    many reads on the server side (SGLang sends one BatchTokenIDOut per iteration)."""


@dataclass
class RankStats:
    rank: int
    stats: dict


@dataclass
class ProfileDone:
    rank: int
    path: str | None
    error: str | None
