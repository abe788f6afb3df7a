"""Acceptance where it varies: per-position acceptance (p_k, α_k) by batch-size bucket and by
context-length bucket, from phase-stream records (`bs`, `accepted`, and `ctx` where the server
sends it).

Buckets (the design note's "per-request context"):
- batch size: SGLang's default adaptive thresholds (1, 8, 32, 64) plus the powers of two; a batch
  belongs to the largest edge <= its size, as SGLang routes a batch to its largest config key;
- context length: powers of two from 256; a context below 256 is the first bucket (named `ctx1`,
  its smallest member, like every other bucket).
A bucket is named `bs<lo>` or `ctx<lo>` (series and profile categories use the name).

The histogram h[j] counts request-verifies that accepted exactly j drafts; p_k = Σ_{j≥k} h[j] / Σ h,
α_k = p_k / p_{k−1}. `histogram_from_positions` goes back from (verifies, p_1..p_s) to h, which is
how a recording's sampled series give their counts back.
Standard library only (the engine, an SGLang server and the tuner may all import it); must not do
I/O or know about costs or settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from probes.names import R_ACCEPTED, R_BS, R_CTX

SGLANG_DEFAULT_THRESHOLDS: tuple[int, ...] = (1, 8, 32, 64)
"""SGLang 0.5.23's default `--speculative-adaptive` tiers start at these batch sizes."""
CTX_FIRST = 256
MAX_EDGE = 1 << 30
"""Edges stop here: a larger batch or context is the last bucket (no record comes near it)."""

BS, CTX = "bs", "ctx"


def _pow2(start: int) -> list[int]:
    out, v = [], start
    while v <= MAX_EDGE:
        out.append(v)
        v *= 2
    return out


BS_EDGES: tuple[int, ...] = tuple(sorted(set(SGLANG_DEFAULT_THRESHOLDS) | set(_pow2(1))))
CTX_EDGES: tuple[int, ...] = (1, *_pow2(CTX_FIRST))


def _lo(edges: Sequence[int], n: int) -> int:
    lo = edges[0]
    for e in edges:
        if e > n:
            break
        lo = e
    return lo


def bucket(kind: str, n: int) -> str:
    """The bucket name of a batch size (kind "bs") or a context length (kind "ctx"), e.g. bs8, ctx512."""
    return f"{kind}{_lo(BS_EDGES if kind == BS else CTX_EDGES, max(int(n), 1))}"


def parse_bucket(name: str) -> tuple[str, int] | None:
    """("bs", 8) for "bs8"; None for anything that is not a bucket name."""
    for kind in (CTX, BS):
        rest = name[len(kind):]
        if name.startswith(kind) and rest.isdigit():
            lo = int(rest)
            if lo in (BS_EDGES if kind == BS else CTX_EDGES):
                return kind, lo
    return None


def bucket_range(name: str) -> str:
    """People's words for a bucket: "batch 8–15", "context 256–511", "context < 256"."""
    parsed = parse_bucket(name)
    if parsed is None:
        return name
    kind, lo = parsed
    edges = BS_EDGES if kind == BS else CTX_EDGES
    i = edges.index(lo)
    word = "batch" if kind == BS else "context"
    if kind == CTX and lo == 1:
        return f"{word} < {edges[1]}"
    if i + 1 >= len(edges):
        return f"{word} ≥ {lo}"
    hi = edges[i + 1] - 1
    return f"{word} {lo}" if hi == lo else f"{word} {lo}–{hi}"


def sort_key(name: str) -> tuple[int, int]:
    """Batch buckets first, then context buckets, each smallest first."""
    parsed = parse_bucket(name)
    if parsed is None:
        return (2, 0)
    return (0 if parsed[0] == BS else 1, parsed[1])


def _ints(x: Any) -> list[int] | None:
    if not isinstance(x, list) or not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in x):
        return None
    return x


def histograms(records: Iterable[Mapping[str, Any]], max_accepted: int = 64) -> dict[str, list[int]]:
    """Correct-drafts histograms per bucket over records of one setting.

    A record counts in its batch bucket (by `bs`); each request of it counts in its context bucket
    when the record carries a `ctx` list as long as `accepted`. A record whose fields are malformed
    (or an accepted count above max_accepted) is skipped, never raised on: older servers and
    damaged recordings must not stop a report."""
    out: dict[str, list[int]] = {}

    def add(name: str, a: int) -> None:
        h = out.setdefault(name, [])
        if a >= len(h):
            h.extend([0] * (a + 1 - len(h)))
        h[a] += 1

    for r in records:
        acc = _ints(r.get(R_ACCEPTED))
        bs = r.get(R_BS)
        if acc is None or not acc or any(a > max_accepted for a in acc):
            continue
        if isinstance(bs, int) and not isinstance(bs, bool) and bs >= 1:
            name = bucket(BS, bs)
            for a in acc:
                add(name, a)
        ctx = _ints(r.get(R_CTX))
        if ctx is not None and len(ctx) == len(acc):
            for a, c in zip(acc, ctx):
                add(bucket(CTX, c), a)
    return out


@dataclass(frozen=True)
class PositionAcceptance:
    """p[k-1] = p_k, alpha[k-1] = α_k (NaN where p_{k-1} is 0); tau = 1 + Σ p_k."""

    verifies: int
    p: tuple[float, ...]
    alpha: tuple[float, ...]
    tau: float


def position_acceptance(h: Sequence[float], positions: int) -> PositionAcceptance:
    """p_k and α_k for k = 1..positions from one histogram (NaNs when it is empty)."""
    total = float(sum(h))
    if total <= 0:
        nan = (math.nan,) * positions
        return PositionAcceptance(0, nan, nan, math.nan)
    p, tail = [], total
    for k in range(1, positions + 1):
        tail -= h[k - 1] if k - 1 < len(h) else 0
        p.append(max(tail, 0.0) / total)
    alpha, prev = [], 1.0
    for pk in p:
        alpha.append(pk / prev if prev > 0 else math.nan)
        prev = pk
    return PositionAcceptance(int(round(total)), tuple(p), tuple(alpha), 1.0 + sum(p))


def histogram_from_positions(verifies: float, p: Sequence[float]) -> list[int] | None:
    """h from (verifies, p_1..p_s), the inverse of position_acceptance when s covers every
    accepted count: h[j] = V·(p_j − p_{j+1}), p_0 = 1, p_{s+1} = 0. None when the readings are not
    counts (NaN, negative, a p_k that rises)."""
    if not (isinstance(verifies, (int, float)) and math.isfinite(verifies) and verifies >= 0.5):
        return None
    if any(not (isinstance(x, (int, float)) and math.isfinite(x)) for x in p):
        return None
    full = [1.0, *p, 0.0]
    h = []
    for j in range(len(full) - 1):
        c = verifies * (full[j] - full[j + 1])
        if c < -0.5:
            return None
        h.append(max(0, int(round(c))))
    return h


def add(a: Sequence[int], b: Sequence[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
