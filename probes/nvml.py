"""NVML sampler: reads this host's GPUs about 10 times a second on a thread and emits `gpu<i>/...`.

Each tick reads every device once (nvitop's one-shot batching): one `nvmlDeviceGetFieldValues` call
for power and the PCIe / NVLink counters, one GPM sample (SM activity, occupancy, tensor activity
where supported: Hopper and later), utilisation, memory, SM clock, temperature and the compute
processes. The values go through probes.gpu_readings (rates, units, NaN) and out through
`emit(t, series, value)`. A query a device does not support reads NaN from then on (it is not
retried every tick); a host without NVML gives `available == False` and a `reason`, never an
exception. Must not import tuner; must not call NVML from any thread but its own once started.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from probes.gpu_readings import (
    SERIES, RateConverter, RawReading, match_ranks, normalize_bus_id, series_name, server_pids,
)

log = logging.getLogger(__name__)

Emit = Callable[[float, str, float], None]

_UINT_MAX = 0xFFFFFFFF  # NVML's scope id for "all links"
_GPM_METRICS = {  # our key -> NVML_GPM_METRIC_* name
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "pcie_rx": "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
    "pcie_tx": "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    "nvlink_rx": "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
    "nvlink_tx": "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
}
_FIELDS = {  # RawReading attribute -> (NVML_FI_* name, scope id)
    "power_mw": ("NVML_FI_DEV_POWER_INSTANT", 0),
    "pcie_rx_bytes": ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0),
    "pcie_tx_bytes": ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0),
    "nvlink_rx_kib": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", _UINT_MAX),
    "nvlink_tx_kib": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", _UINT_MAX),
}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    bus_id: str | None
    uuid: str
    rank: int | None
    """The server rank running on this GPU (matched by PCI bus id), or None."""


def _clock_fn(clock: Any) -> Callable[[], float]:
    # The core's clocks are objects with now(); a bare callable works too.
    return clock.now if hasattr(clock, "now") else clock


class _Device:
    """One GPU's handle plus what it turned out not to support (asked once, then skipped)."""

    def __init__(self, nv: Any, index: int):
        self.nv = nv
        self.index = index
        self.handle = nv.nvmlDeviceGetHandleByIndex(index)
        self.unsupported: set[str] = set()
        self.name = self._try("name", lambda: _text(nv.nvmlDeviceGetName(self.handle))) or f"GPU {index}"
        self.uuid = self._try("uuid", lambda: _text(nv.nvmlDeviceGetUUID(self.handle))) or ""
        self.bus_id = normalize_bus_id(self._try("pci", lambda: _text(nv.nvmlDeviceGetPciInfo(self.handle).busId)))
        self.converter = RateConverter()
        self.fields = [(attr, getattr(nv, fi), scope) for attr, (fi, scope) in _FIELDS.items() if hasattr(nv, fi)]
        self.gpm_ids = {k: getattr(nv, m) for k, m in _GPM_METRICS.items() if hasattr(nv, m)}
        self.gpm_prev = self.gpm_cur = None
        self.gpm_primed = False
        supported = self._try("gpm", lambda: nv.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
        if supported:
            self.gpm_prev = nv.nvmlGpmSampleAlloc()
            self.gpm_cur = nv.nvmlGpmSampleAlloc()
        else:
            self.unsupported.add("gpm")

    def _try(self, what: str, fn: Callable[[], Any]) -> Any:
        if what in self.unsupported:
            return None
        try:
            return fn()
        except self.nv.NVMLError as e:
            # NOT_SUPPORTED / NO_PERMISSION stay so: stop asking. Anything else may pass: ask again.
            if getattr(e, "value", None) in (self.nv.NVML_ERROR_NOT_SUPPORTED, self.nv.NVML_ERROR_NO_PERMISSION,
                                             getattr(self.nv, "NVML_ERROR_FUNCTION_NOT_FOUND", -1)):
                self.unsupported.add(what)
            return None
        except Exception as e:  # noqa: BLE001 - a bindings/driver mismatch must read as N/A
            log.debug("nvml %s on GPU %d: %s", what, self.index, e)
            self.unsupported.add(what)
            return None

    def read(self, t: float) -> RawReading:
        nv, h = self.nv, self.handle
        raw = RawReading(t=t)
        util = self._try("util", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            raw.util_gpu, raw.util_mem = util.gpu, util.memory
        mem = self._try("mem", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            raw.mem_used_bytes, raw.mem_total_bytes = mem.used, mem.total
        raw.sm_clock_mhz = self._try("clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        raw.temp_c = self._try("temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        raw.power_limit_mw = self._try("power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        self._read_fields(raw)
        if raw.power_mw is None:
            raw.power_mw = self._try("power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        raw.gpm = self._read_gpm()
        procs = self._try("procs", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h))
        if procs is not None:
            raw.process_mem_bytes = {int(p.pid): (None if p.usedGpuMemory is None else float(p.usedGpuMemory))
                                     for p in procs}
        return raw

    def _read_fields(self, raw: RawReading) -> None:
        if "fields" in self.unsupported or not self.fields:
            return
        values = self._try("fields", lambda: self.nv.nvmlDeviceGetFieldValues(
            self.handle, [(fid, scope) for _, fid, scope in self.fields]))
        if values is None:
            return
        for (attr, _, _), v in zip(self.fields, values):
            if v.nvmlReturn == 0:
                setattr(raw, attr, float(_field_value(self.nv, v)))

    def _read_gpm(self) -> dict[str, float | None]:
        if "gpm" in self.unsupported or self.gpm_cur is None:
            return {}
        nv = self.nv
        if self._try("gpm", lambda: nv.nvmlGpmSampleGet(self.handle, self.gpm_cur)) is None:
            return {}
        out: dict[str, float | None] = {}
        if self.gpm_primed:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(self.gpm_ids)
            mg.sample1, mg.sample2 = self.gpm_prev, self.gpm_cur
            keys = list(self.gpm_ids)
            for i, k in enumerate(keys):
                mg.metrics[i].metricId = self.gpm_ids[k]
            if self._try("gpm_metrics", lambda: nv.nvmlGpmMetricsGet(mg)) is not None:
                for i, k in enumerate(keys):
                    out[k] = mg.metrics[i].value if mg.metrics[i].nvmlReturn == 0 else None
        self.gpm_prev, self.gpm_cur = self.gpm_cur, self.gpm_prev
        self.gpm_primed = True
        return out

    def close(self) -> None:
        for s in (self.gpm_prev, self.gpm_cur):
            if s is not None:
                try:
                    self.nv.nvmlGpmSampleFree(s)
                except Exception:  # noqa: BLE001 - freeing at shutdown must not raise
                    pass


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _field_value(nv: Any, v: Any) -> float:
    t = v.valueType
    if t == nv.NVML_VALUE_TYPE_DOUBLE:
        return v.value.dVal
    if t == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
        return v.value.uiVal
    if t == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return v.value.ulVal
    if t == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return v.value.sllVal
    if t == getattr(nv, "NVML_VALUE_TYPE_SIGNED_INT", -1):
        return v.value.siVal
    return v.value.ullVal


class NvmlSampler:
    """Sample every local GPU at `interval_s` on a daemon thread; emit `gpu<i>/<metric>` values.

    Example:
        sampler = NvmlSampler(lambda t, series, v: print(t, series, v), time.time,
                              rank_info=[{"tp_rank": 0, "pid": 1234, "pci_bus_id": "0000:18:00.0"}])
        if not sampler.available:
            print(sampler.reason)      # e.g. "NVML not available: NVML Shared Library Not Found"
        sampler.start(); ...; sampler.stop()

    Command line equivalent: `nvidia-smi --query-gpu=utilization.gpu,memory.used,power.draw,
    clocks.sm,temperature.gpu --format=csv -lms 100` plus `dcgmi dmon` for the GPM fields.

    Args:
        emit: called as emit(t, series, value) from the sampler thread (value NaN = not available).
        clock: the session clock (an object with now(), or a callable) giving t.
        interval_s: the tick (default 0.1 s, about 10 Hz).
        rank_info: the server's ranks (tp_rank, pid, pci_bus_id) to match GPUs and count server memory.
    """

    def __init__(self, emit: Emit, clock: Any = time.time, *, interval_s: float = 0.1,
                 rank_info: Iterable[Mapping[str, Any]] = ()):
        self._emit = emit
        self._now = _clock_fn(clock)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._devices: list[_Device] = []
        self._nv = None
        self.reason = ""
        self._rank_info: list[Mapping[str, Any]] = list(rank_info)
        self._init()

    # -- state ----------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self._nv is not None and bool(self._devices)

    @property
    def state(self) -> str:
        """`sampling`, `ready`, or `unavailable: <reason>` — for the header and an event."""
        if not self.available:
            return f"unavailable: {self.reason}"
        return "sampling" if self._thread is not None and self._thread.is_alive() else "ready"

    @property
    def devices(self) -> list[GpuInfo]:
        with self._lock:
            ranks = match_ranks({d.index: d.bus_id for d in self._devices}, self._rank_info)
            return [GpuInfo(d.index, d.name, d.bus_id, d.uuid, ranks.get(d.index)) for d in self._devices]

    def set_rank_info(self, rank_info: Iterable[Mapping[str, Any]]) -> None:
        """New server ranks (after a relaunch): re-match GPUs and the processes counted as the server's."""
        with self._lock:
            self._rank_info = list(rank_info)

    # -- life -----------------------------------------------------------------------------------
    def _init(self) -> None:
        try:
            import pynvml as nv  # nvidia-ml-py

            nv.nvmlInit()
        except ImportError:
            self.reason = "NVML not available: the nvidia-ml-py package is not installed"
            return
        except Exception as e:  # noqa: BLE001 - no driver / library / device: one state, not a crash
            self.reason = f"NVML not available: {e}"
            return
        try:
            count = nv.nvmlDeviceGetCount()
            self._devices = [_Device(nv, i) for i in range(count)]
        except Exception as e:  # noqa: BLE001
            self.reason = f"NVML could not list GPUs: {e}"
            self._shutdown(nv)
            return
        if not self._devices:
            self.reason = "NVML sees no GPU on this host"
            self._shutdown(nv)
            return
        self._nv = nv

    def start(self) -> None:
        """Start the sampling thread; a no-op when unavailable or already running."""
        if not self.available or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nv is not None:
            for d in self._devices:
                d.close()
            self._shutdown(self._nv)
            self._nv = None

    @staticmethod
    def _shutdown(nv: Any) -> None:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down twice or after a driver reset
            pass

    # -- sampling -------------------------------------------------------------------------------
    def sample_once(self) -> dict[str, float]:
        """Read every device once and emit; returns {series: value} (used by the thread and tests)."""
        with self._lock:
            pids = server_pids(self._rank_info)
        out: dict[str, float] = {}
        for d in self._devices:
            t = self._now()
            values = d.converter.convert(d.read(t), pids)
            for metric in SERIES:
                name = series_name(d.index, metric)
                out[name] = values[metric]
                self._emit(t, name, values[metric])
        return out

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as e:  # noqa: BLE001 - keep sampling; one bad tick is not fatal
                log.warning("nvml tick failed: %s", e)
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))
