"""What the tuner optimises: an objective (throughput, latency) and an SLO, with the latency figures
it judges them by.

- `parse_slo("itl_p99<=40ms,ttft_p99<=2s")`: terms `<ttft|itl|e2e|queue>_p<50|90|99><=<n><us|ms|s>`;
  anything else is one SloError line.
- `predicted_itl`: the cost model's ITL per setting. SGLang's inter-token latency spreads each
  output's gap over its new tokens, so a request that accepted j drafts in an iteration of T ms sees
  j + 1 tokens of T/(j+1) each; with the acceptance curve's P(accepted = j) the per-token
  distribution, and its quantile, follow. T's error bar carries over (T_sd/(j+1)).
- `measured_itl`: the same figure from phase records (each request of each iteration: wall time over
  its accepted + 1 tokens), so it is known the moment a segment ends; the load driver's exact timings
  (tuner.core.latency) judge TTFT and queue terms, which need open-loop arrivals (`--rate`).
- `Objective.pick`: the best prediction under the objective (highest tok/s meeting the SLO; lowest
  p99 ITL for `latency`), or the nearest to meeting it when none does.

Pure: no I/O, no store, no clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from tuner.core import latency as L

THROUGHPUT = "throughput"
LATENCY = "latency"
OBJECTIVES = (THROUGHPUT, LATENCY)
RATE_ONLY = ("ttft", "queue", "e2e")
"""Terms judged only under open-loop arrivals: with N requests always in flight, TTFT and queue time
barely move with the setting."""

_TERM = re.compile(r"^(ttft|itl|e2e|queue)_p(50|90|99)\s*<=\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(us|µs|ms|s)$")
_UNIT = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


class SloError(ValueError):
    """An SLO that does not parse (one line)."""


@dataclass(frozen=True)
class Term:
    """kind's q-quantile must be at most limit_s seconds."""

    kind: str
    q: float
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.kind}_p{round(self.q * 100)}"

    def text(self) -> str:
        return f"{self.name}<={L.ms_text(self.limit_s).replace(' ', '')}"


def parse_slo(text: str) -> tuple[Term, ...]:
    """`itl_p99<=40ms,ttft_p99<=2s` -> terms; SloError (one line) on anything else."""
    terms: list[Term] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _TERM.match(part)
        if m is None:
            raise SloError(f"--slo: cannot read {part!r} (want e.g. itl_p99<=40ms,ttft_p99<=2s: "
                           "ttft|itl|e2e|queue, p50|p90|p99, a limit in us, ms or s)")
        kind, q, n, unit = m.groups()
        limit = float(n) * _UNIT[unit]
        if not limit > 0:
            raise SloError(f"--slo: {part!r}: the limit must be above 0")
        term = Term(kind, int(q) / 100, limit)
        if any(t.name == term.name for t in terms):
            raise SloError(f"--slo: {term.name} given twice")
        terms.append(term)
    if not terms:
        raise SloError("--slo: empty (want e.g. itl_p99<=40ms)")
    return tuple(terms)


# -- ITL: predicted and measured ------------------------------------------------------------------------

def _accept_dist(p: Sequence[float], steps: int) -> list[float]:
    """P(accepted = j), j = 0..steps, from p_k = P(accepted ≥ k) (a chain; deeper than measured: 0)."""
    pk = [1.0] + [max(0.0, min(1.0, p[k - 1])) if k <= len(p) else 0.0 for k in range(1, steps + 1)] + [0.0]
    return [max(0.0, pk[j] - pk[j + 1]) for j in range(steps + 1)]


def itl_quantile_tokens(p: Sequence[float], steps: int, q: float) -> int:
    """j + 1: the tokens per output at the q-quantile of per-token ITL (ITL = T/(j+1) falls as j rises)."""
    dist = _accept_dist(p, steps)
    w = [(j + 1) * d for j, d in enumerate(dist)]
    total = sum(w)
    if total <= 0:
        return 1
    # CDF of ITL at T/(j+1) is the token share of outputs with j or more accepted.
    share = 0.0
    for j in range(len(w) - 1, -1, -1):
        share += w[j] / total
        if share >= q:
            return j + 1
    return 1


def predicted_itl(pred: Any, p: Sequence[float], q: float = 0.99) -> tuple[float, float]:
    """(seconds, sd) of the q-quantile ITL at a prediction's iteration time (`t_ms`, `t_sd`) and
    steps, from the acceptance curve p; NaN when the prediction has no iteration time."""
    t, sd = getattr(pred, "t_ms", math.nan), getattr(pred, "t_sd", math.nan)
    if t is None or not math.isfinite(t):
        return math.nan, math.nan
    n = itl_quantile_tokens(p, int(getattr(pred.setting, "steps", 0)), q)
    return t / 1000.0 / n, (sd / 1000.0 / n) if sd is not None and math.isfinite(sd) else math.nan


def itl_values(iters: Iterable[Any]) -> list[float]:
    """Per-token ITL (seconds) from phase-record iterations (.wall_ms, .accepted per request)."""
    out: list[float] = []
    for it in iters:
        for a in it.accepted:
            n = int(a) + 1
            out += [it.wall_ms / 1000.0 / n] * n
    return out


def measured_itl(iters: Iterable[Any], q: float = 0.99) -> float:
    return L.percentile(itl_values(iters), q)


SLO_WINDOW_GAPS = 1000
"""Token gaps in one window an ITL SLO is read over: enough that its p99 is a quantile, not the
largest gap."""


def windowed_itl(iters: Iterable[Any], q: float = 0.99, gaps: int = SLO_WINDOW_GAPS) -> float:
    """The q-quantile ITL as an SLO is read, window after window: consecutive iterations cut into
    windows of at least `gaps` token gaps, each window's q-quantile taken; the figure is the 90th
    percentile of those (9 windows in 10 at or under it), the largest of fewer than 5. With less
    than one window, the pooled quantile (NaN for none). One pooled quantile over a whole
    measurement hides the variation between windows: a setting 5 % under the limit by it missed the
    SLO in 4 of 10 windows (benchmarks/results/slo_tune_cpu.md)."""
    wins: list[float] = []
    cur: list[float] = []
    for it in iters:
        cur += itl_values([it])
        if len(cur) >= gaps:
            wins.append(L.percentile(cur, q))
            cur = []
    if not wins:
        return L.percentile(cur, q)
    return max(wins) if len(wins) < 5 else L.percentile(wins, 0.9)


# -- the objective ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Objective:
    """throughput (today's), latency (minimise p99 ITL), or throughput under `slo` terms."""

    kind: str = THROUGHPUT
    slo: tuple[Term, ...] = ()
    open_loop: bool = False        # --rate: TTFT/queue/e2e terms are judged too
    p: tuple[float, ...] = field(default=(), compare=False)   # the acceptance curve predictions use

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise SloError(f"--objective is {' or '.join(OBJECTIVES)}, got {self.kind!r}")

    @property
    def plain(self) -> bool:
        """Today's behaviour: tok/s alone."""
        return self.kind == THROUGHPUT and not self.slo

    @property
    def itl_term(self) -> Term | None:
        return next((t for t in self.slo if t.kind == "itl"), None)

    @property
    def judged(self) -> tuple[Term, ...]:
        """The terms that are judged (TTFT/queue/e2e only under --rate)."""
        return tuple(t for t in self.slo if self.open_loop or t.kind not in RATE_ONLY)

    @property
    def unjudged(self) -> tuple[Term, ...]:
        return tuple(t for t in self.slo if t not in self.judged)

    def describe(self) -> str:
        if self.plain:
            return "throughput"
        if self.kind == LATENCY:
            return "latency (lowest p99 ITL)"
        out = "tok/s subject to " + ",".join(t.text() for t in self.slo)
        if self.unjudged:
            out += " (" + ", ".join(t.name for t in self.unjudged) + " judged only under --rate)"
        return out

    def itl_q(self) -> float:
        t = self.itl_term
        return t.q if t is not None else 0.99

    def meets(self, figures: Mapping[str, float]) -> bool | None:
        """Whether measured figures {term name: seconds} meet every judged term; None if one is unknown."""
        out = True
        for t in self.judged:
            v = figures.get(t.name, math.nan)
            if not math.isfinite(v):
                return None
            out = out and v <= t.limit_s
        return out

    def miss(self, figures: Mapping[str, float]) -> float:
        """How far the worst judged term is over its limit (ratio - 1; ≤ 0 meets): nearest = smallest."""
        worst = -math.inf
        for t in self.judged:
            v = figures.get(t.name, math.nan)
            worst = max(worst, v / t.limit_s - 1 if math.isfinite(v) else math.inf)
        return worst if self.judged else -math.inf

    def pick(self, preds: Sequence[Any], p: Sequence[float]) -> tuple[Any | None, bool]:
        """(the best prediction under the objective, whether it is predicted to meet the SLO).
        throughput: highest tok/s; latency: lowest predicted p99 ITL; an ITL SLO: highest tok/s among
        those predicted to meet it, else the nearest to meeting it (False)."""
        ok = [x for x in preds if x.tok_s is not None]
        if not ok:
            return None, False
        if self.plain:
            return max(ok, key=lambda x: x.tok_s), True
        q = self.itl_q()
        itl = {id(x): predicted_itl(x, p, q)[0] for x in ok}
        known = [x for x in ok if math.isfinite(itl[id(x)])]
        if not known:
            return max(ok, key=lambda x: x.tok_s), True
        if self.kind == LATENCY:
            return min(known, key=lambda x: (itl[id(x)], -x.tok_s)), True
        term = self.itl_term
        if term is None:        # only rate terms: the model predicts no TTFT, so tok/s leads
            return max(ok, key=lambda x: x.tok_s), True
        # Predicted to meet it with its error bar: a prediction at the limit misses about half the time.
        sd = {id(x): predicted_itl(x, p, q)[1] for x in known}
        meet = [x for x in known if itl[id(x)] + 2 * (sd[id(x)] if math.isfinite(sd[id(x)]) else 0.0)
                <= term.limit_s]
        if meet:
            return max(meet, key=lambda x: x.tok_s), True
        return min(known, key=lambda x: itl[id(x)]), False

    def settle_best(self, incumbent: Any, measured: Mapping[Any, float],
                    figures: Callable[[Any], Mapping[str, float]]) -> Any:
        """The setting to end on: under an SLO, when the incumbent misses it and a measured setting
        meets it, the fastest that meets it (meeting beats missing, as in the A/B's verdict: a chain
        of "nearer" verdicts can end on a setting that misses while one measured earlier met it);
        when none meets, the nearest to meeting it (the verdict between two that miss, and the
        setting the result names as the nearest); else the incumbent. `measured`: setting -> tok/s;
        `figures(setting)`: its measured figures."""
        if not self.slo or incumbent is None or self.meets(figures(incumbent)):
            return incumbent
        meeting = [s for s in measured if self.meets(figures(s))]
        if meeting:
            return max(meeting, key=lambda s: measured[s])
        nearest = min(measured, key=lambda s: self.miss(figures(s)), default=incumbent)
        return nearest if self.miss(figures(nearest)) < self.miss(figures(incumbent)) else incumbent

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "slo": [t.text() for t in self.slo], "open_loop": self.open_loop,
                "judged": [t.name for t in self.judged]}
