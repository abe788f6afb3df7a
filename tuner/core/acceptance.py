"""Acceptance maths from the correct-drafts histogram; pure functions, defined below.

h[j] = verify rounds (per request) that accepted exactly j drafts. Then
  p_k   = sum_{j>=k} h[j] / sum h            unconditional acceptance of draft position k (p_0 = 1)
  a_k   = p_k / p_(k-1)                      conditional acceptance of position k
  tau(s) = 1 + sum_{k<=s} p_k                accept length, the bonus token included
The cost-model side (tok/s = B * tau / T) lives in the tuner; this module must not know costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from probes import accept_buckets as AB

NAN = math.nan


def histogram(accepted: Iterable[int], size: int = 0) -> list[int]:
    """Histogram of correct-draft counts, e.g. from phase-stream `accepted` lists."""
    h = [0] * size
    for a in accepted:
        a = int(a)
        if a < 0:
            raise ValueError(f"negative accepted count {a}")
        if a >= len(h):
            h.extend([0] * (a + 1 - len(h)))
        h[a] += 1
    return h


def add_histograms(a: Sequence[float], b: Sequence[float]) -> list[float]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def histogram_delta(new: Sequence[float], old: Sequence[float]) -> list[float] | None:
    """new - old for cumulative counters; None when any bin went down (the server restarted)."""
    n = max(len(new), len(old))
    out = []
    for i in range(n):
        d = (new[i] if i < len(new) else 0) - (old[i] if i < len(old) else 0)
        if d < 0:
            return None
        out.append(d)
    return out


def position_acceptance(h: Sequence[float]) -> list[float]:
    """[p_1, ..., p_m] for m = len(h) - 1; NaNs when the histogram is empty (the one definition
    is probes.accept_buckets', shared with the engine side and the profile export)."""
    return list(AB.position_acceptance(h, max(len(h) - 1, 0)).p)


def conditional_acceptance(p: Sequence[float]) -> list[float]:
    """[a_1, ..., a_m] with a_k = p_k / p_(k-1), p_0 = 1; NaN where p_(k-1) is 0 or NaN."""
    out = []
    prev = 1.0
    for pk in p:
        out.append(pk / prev if prev > 0 and not math.isnan(prev) else NAN)
        prev = pk
    return out


def accept_length(p: Sequence[float], steps: int | None = None) -> float:
    """tau(s) = 1 + sum_{k<=s} p_k (all positions when steps is None)."""
    ps = p if steps is None else p[:steps]
    if any(math.isnan(x) for x in ps):
        return NAN
    return 1.0 + float(sum(ps))


def accept_rate(h: Sequence[float], num_draft_tokens: int | float) -> float:
    """SGLang's accept rate: correct drafts / (verifies x (num_draft_tokens - 1)); NaN if unknown."""
    total = float(sum(h))
    try:
        slots = float(num_draft_tokens) - 1.0
    except (TypeError, ValueError):
        return NAN
    if total <= 0 or not slots > 0:
        return NAN
    return sum(j * c for j, c in enumerate(h)) / (total * slots)


@dataclass(frozen=True)
class Acceptance:
    """Everything the histogram says. p[k-1] is p_k; alpha[k-1] is a_k."""

    verifies: float
    p: tuple[float, ...]
    alpha: tuple[float, ...]
    accept_len: float
    accept_rate: float


def summarize(h: Sequence[float], num_draft_tokens: int | float | None = None,
              positions: int | None = None) -> Acceptance:
    """p_k, a_k, tau and the accept rate from one histogram.

    Args:
        h: the correct-drafts histogram (counts or count deltas).
        num_draft_tokens: the active num_draft_tokens, for the accept rate (None: NaN).
        positions: report at least this many positions (zero-padded histogram), e.g. the active steps,
            so a window where nothing deep was accepted still shows p_k = 0 for the deep positions.
    """
    h = list(h)
    if positions is not None and len(h) < positions + 1:
        h += [0] * (positions + 1 - len(h))
    p = position_acceptance(h)
    total = float(sum(h))
    tau = NAN if total <= 0 else 1.0 + sum(j * c for j, c in enumerate(h)) / total
    return Acceptance(
        verifies=total,
        p=tuple(p),
        alpha=tuple(conditional_acceptance(p)),
        accept_len=tau,
        accept_rate=NAN if num_draft_tokens is None else accept_rate(h, num_draft_tokens),
    )
