"""Latency percentiles per window, from the server's histograms and from the load driver's timings.

Two sources, kept apart because they answer differently:
- the server's Prometheus histograms (SGLang's `time_to_first_token`, `inter_token_latency`,
  `e2e_request_latency`, `queue_time`): a window's counts are the bucket deltas between two scrapes,
  so a percentile is only known to a bucket, and is shown as one ("p99 ≤ 40 ms");
- the load driver's own per-request timings (`load_request` events): exact. Inter-token latency is
  SGLang's: each later output's gap spread over its new tokens, once per token; the raw gap per
  output (per burst of accepted tokens) is kept beside it.

Pure functions over plain data (label/value pairs, event data); it must not read a server, the
store or a clock. Bad input is one LatencyError line.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tuner.core.events import EventKind

NAN = math.nan
QUANTILES = (0.5, 0.9, 0.99)
KINDS = ("ttft", "itl", "e2e", "queue")
"""What is measured, in the order shown."""
LABELS = {"ttft": "TTFT", "itl": "ITL", "e2e": "e2e", "queue": "queue"}
HISTOGRAMS = {
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "e2e": "sglang:e2e_request_latency_seconds",
    "queue": "sglang:queue_time_seconds",
}
"""SGLang 0.5.23's histogram families (our engine serves the same names and bounds)."""
NO_HISTOGRAMS = ("the server's /metrics has no latency histograms (sglang:time_to_first_token_seconds, "
                 "inter_token_latency_seconds...; SGLang needs --enable-metrics)")


class LatencyError(ValueError):
    """Histograms or timings that cannot be used (one line, for people)."""


# -- server histograms ------------------------------------------------------------------------------

def _le(text: str) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise LatencyError(f"bucket bound le={text!r} is not a number") from None
    if math.isnan(v):
        raise LatencyError("bucket bound le=NaN")
    return v


def cumulative(name: str, buckets: Iterable[tuple[Mapping[str, str], float]]) -> dict[float, float]:
    """{upper bound: cumulative count} of one histogram family, summed over its label sets (e.g.
    SGLang's is_streaming true/false); only the lowest tp_rank counts when several ranks report.

    Raises LatencyError when the family has no buckets, no +Inf bucket, a bound that is not a number,
    a count that is not finite, or counts that fall as the bound rises (non-monotonic)."""
    rows = [(dict(lab), v) for lab, v in buckets]
    if not rows:
        raise LatencyError(f"{name}: no buckets")
    ranks = [lab["tp_rank"] for lab, _ in rows if "tp_rank" in lab]
    if ranks:
        low = min(ranks, key=lambda r: (len(r), r))
        rows = [(lab, v) for lab, v in rows if lab.get("tp_rank", low) == low]
    out: dict[float, float] = {}
    for lab, v in rows:
        if "le" not in lab:
            raise LatencyError(f"{name}: a bucket without its le label")
        if not math.isfinite(v) or v < 0:
            raise LatencyError(f"{name}: bucket le={lab['le']} counts {v}")
        b = _le(lab["le"])
        out[b] = out.get(b, 0.0) + v
    if math.inf not in out:
        raise LatencyError(f"{name}: no +Inf bucket")
    bounds = sorted(out)
    for a, b in zip(bounds, bounds[1:]):
        if out[b] < out[a]:
            raise LatencyError(f"{name}: buckets not monotonic (le={_fmt_le(a)} counts {out[a]:g}, "
                               f"le={_fmt_le(b)} counts {out[b]:g})")
    return out


Counts = Mapping[tuple[float, float], float]
"""Non-cumulative counts per bucket: {(lower bound, upper bound): n}, lo < value ≤ hi."""


def delta(cur: Mapping[float, float], prev: Mapping[float, float] | None) -> dict[tuple[float, float], float] | None:
    """Per-bucket (non-cumulative) counts observed between two scrapes: {(lo, hi): n}, zero buckets
    left out. None when the histogram began again (a count went down, or the bounds changed) or
    there is no previous scrape: nothing can be said for that interval."""
    if prev is None or set(cur) != set(prev):
        return None
    bounds = sorted(cur)
    d = [cur[b] - prev[b] for b in bounds]
    if any(x < 0 for x in d):
        return None
    out: dict[tuple[float, float], float] = {}
    below, lo = 0.0, 0.0
    for b, c in zip(bounds, d):
        n = c - below
        below = c
        if n > 0:
            out[(lo, b)] = n
        lo = b
    return out


def add_counts(a: Counts, b: Counts) -> dict[tuple[float, float], float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


@dataclass(frozen=True)
class Bucketed:
    """A percentile known to a bucket: lo < value ≤ hi (hi is inf for the +Inf bucket)."""

    q: float
    lo: float
    hi: float

    def text(self) -> str:
        """"≤ 40 ms" (the bucket's upper bound), or "> 8 s" in the +Inf bucket."""
        return f"≤ {ms_text(self.hi)}" if math.isfinite(self.hi) else f"> {ms_text(self.lo)}"


def bucket_percentiles(counts: Counts, quantiles: Sequence[float] = QUANTILES) -> dict[float, Bucketed]:
    """The bucket each quantile falls in, from non-cumulative counts {(lo, hi): n}; {} when empty."""
    total = sum(counts.values())
    if total <= 0:
        return {}
    buckets = sorted(counts)
    out: dict[float, Bucketed] = {}
    for q in quantiles:
        need, seen = q * total, 0.0
        for lo, hi in buckets:
            seen += counts[(lo, hi)]
            if seen >= need:
                out[q] = Bucketed(q, lo, hi)
                break
    return out


def buckets_data(counts: Counts) -> list[list[Any]]:
    """Counts as JSON (an event's data): [[lo, le text, n], ...], +Inf as "+Inf"."""
    return [[lo, _fmt_le_label(hi), n] for (lo, hi), n in sorted(counts.items())]


def buckets_from_data(rows: Any) -> dict[tuple[float, float], float]:
    """The inverse of buckets_data; malformed rows are left out (a recording may be damaged)."""
    out: dict[tuple[float, float], float] = {}
    for row in rows if isinstance(rows, (list, tuple)) else ():
        try:
            lo, hi, n = float(row[0]), _le(str(row[1])), float(row[2])
        except (LatencyError, TypeError, ValueError, IndexError):
            continue
        if math.isfinite(n) and n > 0 and math.isfinite(lo) and lo <= hi:
            out[(lo, hi)] = out.get((lo, hi), 0.0) + n
    return out


def _fmt_le_label(b: float) -> str:
    return "+Inf" if b == math.inf else repr(float(b))


def _fmt_le(b: float) -> str:
    return "+Inf" if b == math.inf else f"{b:g}"


def ms_text(seconds: float) -> str:
    """40 ms, 1.2 s, 350 µs: a latency in the unit that reads best."""
    if not math.isfinite(seconds):
        return "n/a"
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 0.001:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


# -- exact percentiles from the load driver -------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile of values (q in 0..1), NaN for none; the one bench_serving uses."""
    if not values:
        return NAN
    v = sorted(values)
    pos = q * (len(v) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(v) - 1)
    return v[i] + (v[j] - v[i]) * (pos - i)


@dataclass(frozen=True)
class RequestTiming:
    """One finished load request, as the load driver timed it (seconds).

    sent: when it was sent (session clock); ttft: to its first output token; e2e: to [DONE];
    queue: the server's queue time when its meta_info says (SGLang with --enable-metrics), else NaN;
    wait: time an arrival waited for a free slot in the driver (open loop with a cap, else 0);
    gaps: (gap, new tokens) for each later output (a burst of accepted tokens).
    """

    sent: float
    ttft: float
    e2e: float
    tokens: int
    gaps: tuple[tuple[float, int], ...] = ()
    queue: float = NAN
    wait: float = 0.0

    @property
    def itl(self) -> list[float]:
        """SGLang's inter-token latency: each gap spread over its new tokens, once per token."""
        return [g / n for g, n in self.gaps for _ in range(n) if n > 0]

    def to_data(self) -> dict[str, Any]:
        d: dict[str, Any] = {"sent": self.sent, "ttft": round(self.ttft, 6), "e2e": round(self.e2e, 6),
                             "tokens": self.tokens, "gaps": [[round(g, 6), n] for g, n in self.gaps]}
        if math.isfinite(self.queue):
            d["queue"] = round(self.queue, 6)
        if self.wait:
            d["wait"] = round(self.wait, 6)
        return d

    @classmethod
    def from_data(cls, d: Mapping[str, Any]) -> "RequestTiming | None":
        """From an event's data; None when it is not one (a damaged or foreign record)."""
        try:
            gaps = tuple((float(g), int(n)) for g, n in d.get("gaps", ()))
            r = cls(float(d["sent"]), float(d["ttft"]), float(d["e2e"]), int(d["tokens"]), gaps,
                    float(d.get("queue", NAN)), float(d.get("wait", 0.0)))
        except (KeyError, TypeError, ValueError):
            return None
        ok = all(math.isfinite(x) and x >= 0 for x in (r.ttft, r.e2e)) and \
            all(math.isfinite(g) and g >= 0 and n >= 0 for g, n in r.gaps)
        return r if ok else None


def values_of(kind: str, requests: Iterable[RequestTiming]) -> list[float]:
    """The samples of one kind over requests (ITL: one per token after the first; gap: one per burst)."""
    out: list[float] = []
    for r in requests:
        if kind == "itl":
            out += r.itl
        elif kind == "gap":
            out += [g for g, _ in r.gaps]
        elif kind in ("ttft", "e2e", "queue", "wait"):
            v = getattr(r, kind)
            if math.isfinite(v):
                out.append(v)
        else:
            raise LatencyError(f"unknown latency figure {kind!r}")
    return out


@dataclass(frozen=True)
class Exact:
    """Exact percentiles of one kind over a window's requests (seconds); n samples behind them."""

    kind: str
    n: int
    p50: float = NAN
    p90: float = NAN
    p99: float = NAN

    def at(self, q: float) -> float:
        return {0.5: self.p50, 0.9: self.p90, 0.99: self.p99}.get(q, NAN)


def exact(kind: str, requests: Sequence[RequestTiming]) -> Exact:
    v = values_of(kind, requests)
    if not v:
        return Exact(kind, 0)
    return Exact(kind, len(v), percentile(v, 0.5), percentile(v, 0.9), percentile(v, 0.99))


def figure(requests: Sequence[RequestTiming], kind: str, q: float) -> float:
    """One figure (e.g. itl, 0.99) over requests; NaN without samples."""
    return percentile(values_of(kind, requests), q)


def bootstrap_ratio(before: Sequence[RequestTiming], after: Sequence[RequestTiming], kind: str, q: float,
                    rounds: int = 400, seed: int = 0, confidence: float = 0.95
                    ) -> tuple[float, float, float]:
    """(figure(after)/figure(before), lo, hi): the ratio of one latency figure and its interval from a
    bootstrap over requests (each draw resamples whole requests, so a request's tokens stay together)."""
    fb, fa = figure(before, kind, q), figure(after, kind, q)
    if not (fb > 0 and math.isfinite(fa)):
        return NAN, NAN, NAN
    per_b = [values_of(kind, [r]) for r in before]
    per_a = [values_of(kind, [r]) for r in after]
    rng = random.Random(seed)
    draws: list[float] = []
    for _ in range(rounds):
        vb = [x for _ in per_b for x in per_b[rng.randrange(len(per_b))]]
        va = [x for _ in per_a for x in per_a[rng.randrange(len(per_a))]]
        b, a = percentile(vb, q), percentile(va, q)
        if b > 0 and math.isfinite(a):
            draws.append(a / b)
    if not draws:
        return fa / fb, NAN, NAN
    draws.sort()
    tail = (1 - confidence) / 2
    return fa / fb, percentile(draws, tail), percentile(draws, 1 - tail)


# -- one window, both sources -------------------------------------------------------------------------

def requests_in(events: Iterable[Any], t0: float, t1: float) -> list[RequestTiming]:
    """The load requests wholly inside [t0, t1] (sent at or after t0, finished by t1) from
    `load_request` events (objects with .t and .data)."""
    out: list[RequestTiming] = []
    for e in events:
        if e.kind != EventKind.LOAD_REQUEST or not (t0 <= e.t <= t1):
            continue
        r = RequestTiming.from_data(e.data)
        if r is not None and r.sent >= t0:
            out.append(r)
    return out


def server_counts(events: Iterable[Any], t0: float, t1: float) -> dict[str, dict[tuple[float, float], float]]:
    """{kind: per-bucket counts} summed over the `latency_buckets` events in (t0, t1]."""
    out: dict[str, dict[tuple[float, float], float]] = {}
    for e in events:
        if e.kind != EventKind.LATENCY_BUCKETS or not (t0 < e.t <= t1):
            continue
        for kind in KINDS:
            if kind in e.data:
                out[kind] = add_counts(out.get(kind, {}), buckets_from_data(e.data[kind]))
    return out


def window_readout(events: Sequence[Any], t0: float, t1: float) -> dict[str, Any]:
    """A window's latency, JSON-shaped (once --json, the recording's report, the TUI's panel):

    {"driver": {kind: {"n", "p50", "p90", "p99"} (seconds) for ttft, itl, gap, e2e, queue, wait
                with samples}, "requests": n,
     "server": {kind: {"n", "p50": [lo, hi], "p90": [...], "p99": [...]}} (bucket bounds, seconds;
                hi null for the +Inf bucket),
     "unavailable": the server's reason when its histograms cannot be read, else null}"""
    reqs = requests_in(events, t0, t1)
    driver: dict[str, Any] = {}
    for kind in ("ttft", "itl", "gap", "e2e", "queue", "wait"):
        ex = exact(kind, reqs)
        if ex.n and not (kind == "wait" and ex.p99 == 0):
            driver[kind] = {"n": ex.n, "p50": ex.p50, "p90": ex.p90, "p99": ex.p99}
    server: dict[str, Any] = {}
    for kind, counts in server_counts(events, t0, t1).items():
        bp = bucket_percentiles(counts)
        if bp:
            server[kind] = {"n": sum(counts.values()),
                            **{_qkey(q): [b.lo, b.hi if math.isfinite(b.hi) else None] for q, b in bp.items()}}
    unavailable = None
    for e in events:
        if e.t <= t1 and e.kind == EventKind.LATENCY_UNAVAILABLE:
            unavailable = str(e.data.get("reason", "")) or None
    return {"driver": driver, "requests": len(reqs), "server": server,
            "unavailable": None if server else unavailable}


def _qkey(q: float) -> str:
    return f"p{round(q * 100):d}"


def readout_lines(r: Mapping[str, Any]) -> list[str]:
    """The window's latency as text lines: one per figure, the driver's exact percentiles then the
    server's buckets ("p99 ≤ 40 ms")."""
    lines: list[str] = []
    drv = r.get("driver") or {}
    names = {**LABELS, "gap": "burst gap", "wait": "slot wait"}
    if drv:
        lines.append(f"{'latency':<10}{'p50':>9} {'p90':>9} {'p99':>9}   load driver, {r.get('requests', 0)} requests")
        for kind in ("ttft", "itl", "gap", "e2e", "queue", "wait"):
            if kind in drv:
                d = drv[kind]
                lines.append(f"  {names[kind]:<8}" + " ".join(f"{ms_text(d[k]):>9}" for k in ("p50", "p90", "p99")))
    srv = r.get("server") or {}
    if srv:
        lines.append("server    histogram buckets (/metrics)")
        for kind in KINDS:
            if kind in srv:
                d = srv[kind]
                parts = [f"{k} {_bucket_text(d[k])}" for k in ("p50", "p90", "p99") if k in d]
                lines.append(f"  {names[kind]:<8}" + "  ".join(parts) + f"   ({int(d['n'])} observed)")
    elif r.get("unavailable"):
        lines.append(f"server    latency: {r['unavailable']}")
    return lines


def _bucket_text(b: Sequence[Any]) -> str:
    lo, hi = b
    return f"≤ {ms_text(hi)}" if hi is not None else f"> {ms_text(lo)}"
