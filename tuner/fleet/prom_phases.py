"""The phase split read from Prometheus: per server, ms per decode iteration of each phase and of
the collectives inside it, from the counters every server already exports.

The counters (probes.inserver.sglang_metrics on SGLang, refengine/server/metrics.py on the engine):
`specdecode:phase_seconds_total{phase,rank}`, `specdecode:phase_comm_seconds_total{phase,rank}`
(the engine only: the plugin cannot split the collectives that run inside SGLang's CUDA graphs; there
the draft-collective share comes from the last trace capture) and `specdecode:iterations_total{rank}`.
Rank 0's counters are read, as tuner.backends.derive reads a /metrics scrape.

`QUERY` is one PromQL expression for every server (rates over `window`); `split` (pure) turns its
answer into a PhaseSplit per scrape instance. The fleet reads it when a server's phase stream is not
reachable (a server seen only through Prometheus). Must not contact a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from probes.names import DRAFT, DRAFT_EXTEND

DRAFT_COMM_PHASES = (DRAFT, DRAFT_EXTEND)


def query(window: str = "30s") -> str:
    """Phase, collective and iteration rates of rank 0, each tagged with `what`."""
    parts = []
    for what, metric, by in (("phase", "specdecode:phase_seconds_total", "instance, phase"),
                             ("comm", "specdecode:phase_comm_seconds_total", "instance, phase"),
                             ("iterations", "specdecode:iterations_total", "instance")):
        parts.append(f'label_replace(sum by ({by}) (rate({metric}{{rank="0"}}[{window}])), '
                     f'"what", "{what}", "", "")')
    return " or ".join(parts)


@dataclass
class PhaseSplit:
    """One server's split over the rate window; ms per iteration (NaN where unknown)."""

    iter_per_s: float = math.nan
    phase_ms: dict[str, float] = field(default_factory=dict)
    comm_ms: dict[str, float] = field(default_factory=dict)

    @property
    def wall_ms(self) -> float:
        return 1e3 / self.iter_per_s if self.iter_per_s > 0 else math.nan

    @property
    def draft_comm_pct(self) -> float | None:
        """The draft's and draft-extend's collectives as a share of the iteration, None when the
        server does not split its collectives (SGLang) or did not decode."""
        known = [self.comm_ms[p] for p in DRAFT_COMM_PHASES if p in self.comm_ms]
        wall = self.wall_ms
        if not known or not math.isfinite(wall) or wall <= 0:
            return None
        return 100.0 * sum(known) / wall


def split(series: list[tuple[dict[str, str], float]]) -> dict[str, PhaseSplit]:
    """The answer to `query()` as a PhaseSplit per instance. Pure."""
    rates: dict[str, dict[str, dict[str, float]]] = {}
    iters: dict[str, float] = {}
    for labels, v in series:
        inst, what = labels.get("instance", ""), labels.get("what")
        if not math.isfinite(v):
            continue
        if what == "iterations":
            iters[inst] = v
        elif what in ("phase", "comm") and labels.get("phase"):
            rates.setdefault(inst, {}).setdefault(what, {})[labels["phase"]] = v
    out: dict[str, PhaseSplit] = {}
    for inst in set(rates) | set(iters):
        it = iters.get(inst, math.nan)
        ps = PhaseSplit(it)
        if it > 0:
            ps.phase_ms = {p: s * 1e3 / it for p, s in rates.get(inst, {}).get("phase", {}).items()}
            ps.comm_ms = {p: s * 1e3 / it for p, s in rates.get(inst, {}).get("comm", {}).items()}
        out[inst] = ps
    return out
