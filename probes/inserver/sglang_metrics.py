"""The SGLang plugin's Prometheus series, exported by SGLang's own /metrics.

SGLang serves /metrics through prometheus_client's MultiProcessCollector over
PROMETHEUS_MULTIPROC_DIR, so a counter created in a scheduler process shows up there with no
route of ours. prometheus_client picks its multiprocess value store when it is first imported,
so it is imported only here, lazily, inside a scheduler process (which inherits the directory):
importing it earlier in SGLang's launcher would break SGLang's own metrics.

Names follow the design's "Names and contracts": specdecode:phase_seconds_total{phase,rank},
specdecode:accept_position_total{k}, specdecode:rank_info{tp_rank,pid,pci_bus_id,host}, plus
specdecode:iterations_total{rank}. On a multi-node launch rank_info also carries `dist_init_addr` and
`node_rank` (SGLang's --dist-init-addr is the same on every node of one model and names node 0): a
follower node's own /metrics then names its leader exactly (tuner.fleet.followers). Must not import
torch or SGLang.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from probes.names import R_PHASE_MS


class PhaseMetrics:
    """Counters fed from finished phase-stream records of one rank."""

    def __init__(self, rank: int, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge

        reg = REGISTRY if registry is None else registry
        self.rank = str(rank)
        self._children: dict[tuple, Any] = {}
        self.phase_seconds = Counter(
            "specdecode:phase_seconds", "Device time per EAGLE decode phase and TP rank "
            "(specdecode plugin, CUDA events).", ["phase", "rank"], registry=reg)
        self.iterations = Counter(
            "specdecode:iterations", "Decode iterations timed by the specdecode plugin.",
            ["rank"], registry=reg)
        self.accept_position = Counter(
            "specdecode:accept_position", "Request-verify rounds that accepted at least k drafts "
            "(k=0: all rounds); rank 0 only.", ["k"], registry=reg)
        # "all": the multiprocess collector keeps the pid label (it strips it in other modes).
        self.rank_info = Gauge(
            "specdecode:rank_info", "One series per TP rank process running the specdecode plugin.",
            ["tp_rank", "pid", "pci_bus_id", "host", "dist_init_addr", "node_rank"], registry=reg,
            multiprocess_mode="all")

    def set_rank_info(self, pci_bus_id: str | None, host: str | None = None, dist_init_addr: str = "",
                      node_rank: str = "") -> None:
        """dist_init_addr, node_rank: "" on one node."""
        self.rank_info.labels(tp_rank=self.rank, pid=str(os.getpid()), pci_bus_id=pci_bus_id or "",
                              host=host or socket.gethostname(), dist_init_addr=dist_init_addr,
                              node_rank=node_rank).set(1)

    def add(self, records: list[dict[str, Any]]) -> None:
        """Counters for a batch of records: sums first, so a batch costs a few increments."""
        if not records:
            return
        phase_s: dict[str, float] = {}
        at_least: dict[int, int] = {}
        for r in records:
            for phase, ms in r.get(R_PHASE_MS, {}).items():
                if ms > 0:
                    phase_s[phase] = phase_s.get(phase, 0.0) + ms / 1e3
            accepted = r.get("accepted")
            # Every rank sees the same acceptance; counting it once keeps sums right.
            if accepted and self.rank == "0":
                at_least[0] = at_least.get(0, 0) + len(accepted)
                for a in accepted:
                    for k in range(1, a + 1):
                        at_least[k] = at_least.get(k, 0) + 1
        self._child(self.iterations, rank=self.rank).inc(len(records))
        for phase, sec in phase_s.items():
            self._child(self.phase_seconds, phase=phase, rank=self.rank).inc(sec)
        for k, n in at_least.items():
            self._child(self.accept_position, k=str(k)).inc(n)

    def _child(self, metric: Any, **labels: str) -> Any:
        key = (id(metric), tuple(labels.values()))
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(**labels)
        return child
