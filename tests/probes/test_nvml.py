"""NVML sampler: the pure conversion logic as properties, and the real NVML on this host.

On a host without NVML (CI) the real library must give a clear state and no exception; on a GPU
host the same test file samples the real devices.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.gpu_readings import (
    SERIES, RateConverter, RawReading, counter_rate, match_ranks, normalize_bus_id, server_memory_mib, server_pids,
)
from probes.nvml import NvmlSampler

MIB = 1024 * 1024


def test_missing_values_are_nan_never_errors():
    out = RateConverter().convert(RawReading(t=1.0))
    assert set(out) == set(SERIES)
    assert all(math.isnan(v) for v in out.values())


def test_units_and_rates():
    conv = RateConverter()
    first = RawReading(t=10.0, util_gpu=87, util_mem=40, mem_used_bytes=20 * 1024 * MIB, mem_total_bytes=141 * 1024 * MIB,
                       power_mw=512_345, power_limit_mw=700_000, sm_clock_mhz=1980, temp_c=55,
                       pcie_rx_bytes=1_000_000, pcie_tx_bytes=0, nvlink_rx_kib=0, nvlink_tx_kib=1000,
                       gpm={"sm_active": 61.5, "sm_occupancy": 22.0, "tensor_active": 35.25, "dram_bw": None},
                       process_mem_bytes={100: 10 * 1024 * MIB, 200: 4 * 1024 * MIB, 300: MIB})
    out = conv.convert(first, server_pids=[100, 200])
    assert out["util_pct"] == 87 and out["mem_util_pct"] == 40
    assert out["mem_used_mib"] == 20 * 1024 and out["mem_total_mib"] == 141 * 1024
    assert out["server_mem_mib"] == 14 * 1024
    assert out["power_w"] == pytest.approx(512.345) and out["power_limit_w"] == 700
    assert out["sm_active_pct"] == 61.5 and out["tensor_active_pct"] == 35.25 and math.isnan(out["dram_bw_pct"])
    assert math.isnan(out["pcie_rx_mbps"])  # a rate needs two readings
    second = RawReading(t=10.5, pcie_rx_bytes=11_000_000, pcie_tx_bytes=2_000_000, nvlink_rx_kib=500_000,
                        nvlink_tx_kib=500)  # tx counter went backwards: a reset
    out = conv.convert(second)
    assert out["pcie_rx_mbps"] == pytest.approx(20.0) and out["pcie_tx_mbps"] == pytest.approx(4.0)
    assert out["nvlink_rx_mbps"] == pytest.approx(500_000 * 1024 / 0.5 / 1e6)
    assert math.isnan(out["nvlink_tx_mbps"])
    assert math.isnan(out["server_mem_mib"])  # no server pids known


def test_gpm_rates_used_when_counters_are_unsupported():
    out = RateConverter().convert(RawReading(t=1.0, gpm={"pcie_rx": 100.0, "nvlink_tx": 2.0}))
    assert out["pcie_rx_mbps"] == pytest.approx(100 * MIB / 1e6)
    assert out["nvlink_tx_mbps"] == pytest.approx(2 * MIB / 1e6)
    assert math.isnan(out["pcie_tx_mbps"])


counter = st.one_of(st.none(), st.floats(0, 1e15), st.integers(0, 2**63))


@settings(max_examples=200, deadline=None)
@given(counter, counter, st.floats(-1, 10))
def test_counter_rate_is_nan_or_non_negative(now, before, dt):
    r = counter_rate(now, before, dt)
    assert math.isnan(r) or r >= 0
    if now is not None and before is not None and dt > 0 and now >= before:
        assert r == pytest.approx((now - before) / dt)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))
def test_bus_id_spellings_agree(domain, bus, dev, fn):
    nvml = f"{domain:08X}:{bus:02X}:{dev:02X}.{fn}"
    torch = f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
    assert normalize_bus_id(nvml) == normalize_bus_id(torch) == normalize_bus_id(nvml.encode())
    if domain == 0:
        assert normalize_bus_id(f"{bus:02x}:{dev:02x}.{fn}") == normalize_bus_id(nvml)


@pytest.mark.parametrize("bad", [None, "", "GPU-1234", "0000:18:00", "zz:00.0", 7, "0000:18:00.9"])
def test_bad_bus_ids(bad):
    assert normalize_bus_id(bad) is None


def test_ranks_matched_by_bus_id_not_index():
    gpus = {0: "00000000:18:00.0", 1: "00000000:2A:00.0", 2: "00000000:3A:00.0"}
    rank_info = [{"tp_rank": "0", "pid": "111", "pci_bus_id": "0000:3a:00.0"},
                 {"tp_rank": 1, "pid": 222, "pci_bus_id": "0000:18:00.0"},
                 {"tp_rank": 2, "pid": "x", "pci_bus_id": "cpu"}]  # a CPU rank has no bus id
    assert match_ranks(gpus, rank_info) == {2: 0, 0: 1}
    assert server_pids(rank_info) == [111, 222]


def test_server_memory_unknown_when_nvml_hides_it():
    assert math.isnan(server_memory_mib({5: None}, [5]))
    assert server_memory_mib({5: 2 * MIB, 6: MIB}, [7]) == 0.0


def test_real_nvml_on_this_host():
    got = []
    sampler = NvmlSampler(lambda t, s, v: got.append((t, s, v)), lambda: 123.0,
                          rank_info=[{"tp_rank": 0, "pid": 1, "pci_bus_id": "0000:00:00.0"}])
    try:
        if not sampler.available:
            # No driver here: a clear state, and start/stop are harmless no-ops.
            assert sampler.state.startswith("unavailable: NVML") and sampler.reason
            assert sampler.devices == []
            sampler.start()
            assert got == []
            return
        values = sampler.sample_once()
        n = len(sampler.devices)
        assert len(values) == n * len(SERIES) == len(got)
        for d in sampler.devices:
            assert values[f"gpu{d.index}/mem_total_mib"] > 0
            assert 0 <= values[f"gpu{d.index}/util_pct"] <= 100
            assert values[f"gpu{d.index}/temp_c"] > 0
    finally:
        sampler.stop()
