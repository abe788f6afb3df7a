"""GPU readings as series: raw NVML values in, `gpu<i>/<metric>` samples out (pure logic, no NVML).

The NVML layer (probes/nvml.py) reads each device once per tick into a `RawReading` (None where a
query is unsupported); this module turns it into series values: counters become rates, units are
converted, anything missing is NaN (nvitop's "N/A, never an exception"). It also matches GPUs to
server ranks by PCI bus id. Must not import pynvml, so it is testable on a machine without GPUs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NAN = math.nan

# Series per GPU (name -> what it is; the unit is in the name). `nvidia-smi` equivalents in brackets.
SERIES: dict[str, str] = {
    "util_pct": "time a kernel was running, % [utilization.gpu]",
    "mem_util_pct": "time device memory was read or written, % [utilization.memory]",
    "sm_active_pct": "SM activity (GPM), %: how much of the chip was busy, unlike util_pct",
    "sm_occupancy_pct": "SM occupancy (GPM), % of the maximum resident warps",
    "tensor_active_pct": "tensor-core activity, any precision (GPM), %",
    "dram_bw_pct": "DRAM bandwidth utilisation (GPM), %",
    "mem_used_mib": "device memory used, MiB [memory.used]",
    "mem_total_mib": "device memory, MiB [memory.total]",
    "server_mem_mib": "memory held by the server's processes on this GPU, MiB",
    "power_w": "power draw, W [power.draw.instant]",
    "power_limit_w": "enforced power limit, W [enforced.power.limit]",
    "sm_clock_mhz": "SM clock, MHz [clocks.sm]",
    "temp_c": "GPU temperature, C [temperature.gpu]",
    "pcie_rx_mbps": "PCIe receive, MB/s (10^6 bytes)",
    "pcie_tx_mbps": "PCIe transmit, MB/s",
    "nvlink_rx_mbps": "NVLink receive, all links, MB/s",
    "nvlink_tx_mbps": "NVLink transmit, all links, MB/s",
}

_MIB = 1024 * 1024


@dataclass
class RawReading:
    """What one tick read from one device. None = unsupported or failed; times are seconds."""

    t: float
    util_gpu: float | None = None
    util_mem: float | None = None
    gpm: Mapping[str, float | None] = field(default_factory=dict)
    """GPM metrics over the last interval: sm_active, sm_occupancy, tensor_active, dram_bw (%),
    pcie_rx, pcie_tx, nvlink_rx, nvlink_tx (MiB/s)."""
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    power_mw: float | None = None
    power_limit_mw: float | None = None
    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    pcie_rx_bytes: float | None = None
    """Cumulative PCIe counters (NVML_FI_DEV_PCIE_COUNT_*_BYTES)."""
    pcie_tx_bytes: float | None = None
    nvlink_rx_kib: float | None = None
    """Cumulative NVLink data counters over all links (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_*, KiB)."""
    nvlink_tx_kib: float | None = None
    process_mem_bytes: Mapping[int, float | None] = field(default_factory=dict)
    """pid -> memory used on this GPU, for every compute process NVML lists."""


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else NAN


class RateConverter:
    """Turns successive RawReadings of one device into series values; keeps the previous counters."""

    def __init__(self) -> None:
        self._prev: RawReading | None = None

    def convert(self, raw: RawReading, server_pids: Iterable[int] = ()) -> dict[str, float]:
        prev, self._prev = self._prev, raw
        g = raw.gpm
        out = {
            "util_pct": _num(raw.util_gpu),
            "mem_util_pct": _num(raw.util_mem),
            "sm_active_pct": _num(g.get("sm_active")),
            "sm_occupancy_pct": _num(g.get("sm_occupancy")),
            "tensor_active_pct": _num(g.get("tensor_active")),
            "dram_bw_pct": _num(g.get("dram_bw")),
            "mem_used_mib": _num(raw.mem_used_bytes) / _MIB,
            "mem_total_mib": _num(raw.mem_total_bytes) / _MIB,
            "server_mem_mib": server_memory_mib(raw.process_mem_bytes, server_pids),
            "power_w": _num(raw.power_mw) / 1000.0,
            "power_limit_w": _num(raw.power_limit_mw) / 1000.0,
            "sm_clock_mhz": _num(raw.sm_clock_mhz),
            "temp_c": _num(raw.temp_c),
        }
        dt = raw.t - prev.t if prev is not None else NAN
        # Counters first (exact over the whole interval); GPM's per-second rates when there are none.
        for key, now, before, scale, gpm_key in (
            ("pcie_rx_mbps", raw.pcie_rx_bytes, prev and prev.pcie_rx_bytes, 1.0, "pcie_rx"),
            ("pcie_tx_mbps", raw.pcie_tx_bytes, prev and prev.pcie_tx_bytes, 1.0, "pcie_tx"),
            ("nvlink_rx_mbps", raw.nvlink_rx_kib, prev and prev.nvlink_rx_kib, 1024.0, "nvlink_rx"),
            ("nvlink_tx_mbps", raw.nvlink_tx_kib, prev and prev.nvlink_tx_kib, 1024.0, "nvlink_tx"),
        ):
            rate = counter_rate(now, before, dt) * scale / 1e6
            if math.isnan(rate) and now is None:
                rate = _num(g.get(gpm_key)) * _MIB / 1e6
            out[key] = rate
        return out


def counter_rate(now: float | None, before: float | None, dt: float) -> float:
    """Per-second rate of a cumulative counter; NaN without two readings, time, or on a reset."""
    n, b = _num(now), _num(before)
    if math.isnan(n) or math.isnan(b) or not (dt > 0) or n < b:
        return NAN
    return (n - b) / dt


def server_memory_mib(process_mem: Mapping[int, float | None], server_pids: Iterable[int]) -> float:
    """Memory on this GPU held by the server's processes; NaN when unknown, 0 when none is here."""
    pids = set(server_pids)
    if not pids or not isinstance(process_mem, Mapping):
        return NAN
    total = 0.0
    for pid, used in process_mem.items():
        if pid in pids:
            v = _num(used)
            if math.isnan(v):
                return NAN  # NVML hides per-process memory (e.g. in some containers)
            total += v
    return total / _MIB


_BUS = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")


def normalize_bus_id(bus_id: Any) -> str | None:
    """Canonical PCI address `dddd:bb:dd.f` (lower case) from NVML's `00000000:18:00.0`, torch's
    `0000:18:00.0` or a bare `18:00.0`; None when it is not a PCI address."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    if not isinstance(bus_id, str):
        return None
    m = _BUS.match(bus_id.strip().lower())
    if not m:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def match_ranks(gpu_bus_ids: Mapping[int, Any], rank_info: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """GPU index -> server rank, by PCI bus id (`specdecode:rank_info{tp_rank,pid,pci_bus_id}`).

    GPUs without a rank (not the server's, or the server on another host) are left out.
    """
    by_bus = {normalize_bus_id(b): i for i, b in gpu_bus_ids.items()}
    by_bus.pop(None, None)
    out: dict[int, int] = {}
    for r in rank_info:
        bus = normalize_bus_id(r.get("pci_bus_id"))
        rank = r.get("tp_rank", r.get("rank"))
        try:
            rank = int(rank)
        except (TypeError, ValueError):
            continue
        if bus in by_bus:
            out[by_bus[bus]] = rank
    return out


def server_pids(rank_info: Iterable[Mapping[str, Any]]) -> list[int]:
    """The rank processes' PIDs from rank_info, as ints; anything else is dropped."""
    pids = []
    for r in rank_info:
        try:
            pid = int(r.get("pid"))
        except (TypeError, ValueError):
            continue
        if pid > 0:
            pids.append(pid)
    return pids


def series_name(gpu_index: int, metric: str) -> str:
    return f"gpu{gpu_index}/{metric}"
