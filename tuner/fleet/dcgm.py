"""GPU readings from NVIDIA's dcgm-exporter through Prometheus, joined to the servers' ranks.

The counters are dcgm-exporter's defaults (`etc/default-counters.csv` in NVIDIA/dcgm-exporter):
DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_FB_USED (MiB),
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (a counter: its rate is read), and the DCP ("profiling") fields
DCGM_FI_PROF_GR_ENGINE_ACTIVE (a ratio), DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES (bytes per second).
DCGM_FI_PROF_SM_ACTIVE is read where an operator enabled it (it is commented out in the defaults).
Each series carries `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName` and the host's name: `Hostname`
up to dcgm-exporter 4.x, `hostname` since its commit d5e5f51 ("Rename Hostname label to hostname").

`QUERY` is one PromQL expression for every host's GPUs and every server's `specdecode:rank_info`, so a
tick costs one request however large the fleet. `join` (pure) matches a GPU to a server rank on
(host, PCI bus id) against `specdecode:rank_info{host,pci_bus_id}`, bus ids normalised as NVML's are
(probes.gpu_readings). A DCGM series missing its host or bus id label is left out, counted in one line
per label. NVML stays the local default (probes/nvml.py); this source is for GPUs on other hosts.
Must not import pynvml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from probes.gpu_readings import normalize_bus_id

RATE_WINDOW = "30s"      # NVLink's counter: the rate over a few scrapes (dcgm-exporter scrapes every 30 s by default)

# dcgm-exporter field -> (our per-GPU reading, scale to our unit). Names follow probes.gpu_readings.SERIES
# where one fits.
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_active_pct", 100.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_mbps", 1e-6),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_mbps", 1e-6),
}
NVLINK_COUNTER = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
NVLINK_RATE = NVLINK_COUNTER + ":rate"
NVLINK_READING = "nvlink_total_per_s"     # the counter's rate, in its own unit (DCGM documents none)
RANK_INFO = "specdecode:rank_info"
HOST_LABELS = ("Hostname", "hostname")

# `or` matches series on their labels without the name, so the rate (same labels as the GPU's gauges)
# also gets a label of its own, or it would be dropped.
QUERY = ('{__name__=~"' + "|".join(list(FIELDS) + [RANK_INFO]) + '"} or label_replace(label_replace('
         f'rate({NVLINK_COUNTER}[{RATE_WINDOW}]), "__name__", "{NVLINK_RATE}", "", ""), "rate", "{RATE_WINDOW}", "", "")')


@dataclass
class GpuJoin:
    """One tick's GPUs, by server instance and TP rank; and what could not be joined."""

    by_server: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    unjoined: list[str] = field(default_factory=list)   # "host bus" of GPUs no server's rank runs on
    problems: list[str] = field(default_factory=list)   # one line per kind of malformed series

    def util_pct(self, instance: str, reading: str = "util_pct", also: tuple[str, ...] = ()) -> float | None:
        """The mean of one reading over a server's GPUs, and those of the instances `also` (its
        follower nodes); None when none is known."""
        vals = [g[reading] for inst in (instance, *also) for g in self.by_server.get(inst, {}).values()
                if reading in g and math.isfinite(g[reading])]
        return sum(vals) / len(vals) if vals else None


def _host(labels: Mapping[str, str]) -> str | None:
    for k in HOST_LABELS:
        if labels.get(k):
            return labels[k]
    return None


def join(series: list[tuple[dict[str, str], float]]) -> GpuJoin:
    """The answer to QUERY as GPU readings per (server instance, rank). Pure."""
    out = GpuJoin()
    ranks: dict[tuple[str, str], tuple[str, int]] = {}
    missing: dict[str, int] = {}
    for labels, _ in series:
        if labels.get("__name__") != RANK_INFO:
            continue
        bus = normalize_bus_id(labels.get("pci_bus_id"))
        try:
            rank = int(labels.get("tp_rank", ""))
        except ValueError:
            continue
        if bus and labels.get("host"):       # a rank on CPU has no bus id: nothing to join
            ranks[(labels["host"], bus)] = (labels.get("instance", ""), rank)
    gpus: dict[tuple[str, str], dict[str, float]] = {}
    for labels, value in series:
        name = labels.get("__name__", "")
        if name == RANK_INFO:
            continue
        reading, scale = (NVLINK_READING, 1.0) if name == NVLINK_RATE else FIELDS.get(name, (None, 1.0))
        if reading is None:
            continue
        host, bus = _host(labels), normalize_bus_id(labels.get("pci_bus_id"))
        if host is None or bus is None:
            lab = "Hostname" if host is None else "pci_bus_id"
            missing[lab] = missing.get(lab, 0) + 1
            continue
        gpus.setdefault((host, bus), {})[reading] = value * scale
    for lab, n in sorted(missing.items()):
        out.problems.append(f"DCGM: {n} series without a {lab} label were left out (cannot join them to a server)")
    for key, readings in sorted(gpus.items()):
        if key in ranks:
            instance, rank = ranks[key]
            out.by_server.setdefault(instance, {})[rank] = readings
        else:
            out.unjoined.append(f"{key[0]} {key[1]}")
    return out


class DcgmSource:
    """One PromQL query per tick for every host's GPUs (tuner.fleet.prometheus.PrometheusClient)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def tick(self) -> GpuJoin:
        """This tick's join; PrometheusError (one line) when Prometheus cannot answer."""
        return join(self.client.query(QUERY))
