"""Pure parts of the Prometheus fleet path: selectors, targets, a target's state, the DCGM join, the
phase split, follower grouping and the report's data from a range answer. No sockets here; the
real Prometheus is in test_prometheus_e2e.py."""

from __future__ import annotations

import math

import pytest

from tuner.fleet import dcgm, prom_phases
from tuner.fleet.followers import FOLLOWER, SERVER, plan
from tuner.fleet.members import Member
from tuner.fleet.prom_report import build, parse_time
from tuner.fleet.prometheus import (PrometheusError, Target, members_of, parse_selector, parse_targets,
                                    target_state)


def test_selector_matches_target_labels_as_promql_does():
    m = parse_selector('{job="sglang", instance=~"10\\\\.0\\\\..*",zone!="b"}')
    assert [(x.name, x.op) for x in m] == [("job", "="), ("instance", "=~"), ("zone", "!=")]
    hit = {"job": "sglang", "instance": "10.0.0.1:30000"}
    assert all(x.matches(hit) for x in m)
    assert not m[1].matches({"instance": "110.0.0.1:30000"})       # anchored, as in PromQL
    assert parse_selector("") == [] and parse_selector("{}") == []
    for bad in ('{job="sglang"', "{job=sglang}", '{job=~"("}'):
        with pytest.raises(PrometheusError) as e:
            parse_selector(bad)
        assert e.value.rc == 2 and "\n" not in str(e.value)


TARGETS = {"activeTargets": [
    {"scrapeUrl": "http://10.0.0.1:30000/metrics", "labels": {"job": "sglang", "instance": "10.0.0.1:30000"},
     "health": "up", "lastError": "", "lastScrape": "2026-01-01T00:00:10.123456789Z",
     "scrapeInterval": "15s", "scrapeTimeout": "10s"},
    {"scrapeUrl": "http://10.0.0.2:9400/metrics", "labels": {"job": "dcgm", "instance": "10.0.0.2:9400"},
     "health": "up", "lastScrape": "2026-01-01T00:00:10Z", "scrapeInterval": "30s", "scrapeTimeout": "10s"},
    {"scrapeUrl": "http://10.0.0.3:30000/custom?x=1", "labels": {"job": "sglang", "instance": "10.0.0.3:30000"},
     "health": "down", "lastError": "connection refused", "lastScrape": "0001-01-01T00:00:00Z"},
    "junk",
]}


def test_targets_become_members_by_selector_and_non_servers_are_one_line_each():
    targets = parse_targets(TARGETS)
    assert [t.instance for t in targets] == ["10.0.0.1:30000", "10.0.0.2:9400", "10.0.0.3:30000"]
    assert targets[0].interval_s == 15 and targets[0].timeout_s == 10 and targets[2].last_scrape is None
    members, skipped = members_of(targets, parse_selector('{job="sglang"}'))
    assert [(m.name, m.url, m.source) for m in members] == [("10.0.0.1:30000", "http://10.0.0.1:30000", "prometheus")]
    assert members[0].labels["instance"] == "10.0.0.1:30000"
    assert len(skipped) == 1 and "not a server's /metrics" in skipped[0]
    with pytest.raises(PrometheusError):
        parse_targets({"data": []})


def test_a_target_is_gone_after_a_failed_scrape_or_one_interval_plus_timeout_of_silence():
    t = parse_targets(TARGETS)[0]
    assert target_state(t, t.last_scrape + 24.9) == ("connected", "")
    state, why = target_state(t, t.last_scrape + 25.1)
    assert state == "gone" and "25.1 s ago" in why
    down = Target("http://x:1/metrics", health="down", last_error="connection refused", last_scrape=1.0)
    assert target_state(down, 1.0) == ("gone", "Prometheus: connection refused")
    assert target_state(Target("http://x:1/metrics"), 0.0)[0] == "connecting"


def _rank(instance, host, rank, bus=""):
    return ({"__name__": "specdecode:rank_info", "instance": instance, "host": host, "tp_rank": str(rank),
             "pci_bus_id": bus, "pid": "1"}, 1.0)


def _dcgm(name, host, bus, v, host_label="Hostname"):
    labels = {"__name__": name, "gpu": "0", "UUID": "GPU-x", "pci_bus_id": bus, "device": "nvidia0",
              "modelName": "NVIDIA H200", "instance": "dcgm:9400"}
    if host is not None:
        labels[host_label] = host
    return labels, v


def test_dcgm_series_join_to_server_ranks_on_host_and_bus_id():
    series = [
        _rank("a:30000", "node-a", 0, "00000000:18:00.0"), _rank("a:30000", "node-a", 1, "0000:19:00.0"),
        _rank("b:30000", "node-b", 0, "0000:18:00.0"),
        _dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", "00000000:18:00.0", 40.0),
        _dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", "00000000:19:00.0", 60.0),
        _dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "node-a", "00000000:18:00.0", 0.25),
        _dcgm("DCGM_FI_PROF_PCIE_TX_BYTES", "node-a", "00000000:18:00.0", 2e6),
        _dcgm(dcgm.NVLINK_RATE, "node-a", "00000000:18:00.0", 5.0),
        _dcgm("DCGM_FI_DEV_GPU_UTIL", "node-b", "00000000:18:00.0", 90.0, host_label="hostname"),  # 4.6+ spelling
        _dcgm("DCGM_FI_DEV_GPU_UTIL", "node-c", "00000000:18:00.0", 10.0),       # no server there
        _dcgm("DCGM_FI_DEV_GPU_UTIL", None, "00000000:1a:00.0", 10.0),           # no host label
        _dcgm("DCGM_FI_DEV_POWER_USAGE", "node-a", "", 10.0),                    # no bus id
    ]
    j = dcgm.join(series)
    a = j.by_server["a:30000"]
    assert a[0] == {"util_pct": 40.0, "gr_active_pct": 25.0, "pcie_tx_mbps": 2.0, "nvlink_total_per_s": 5.0}
    assert a[1] == {"util_pct": 60.0}
    assert j.util_pct("a:30000") == 50.0 and j.util_pct("b:30000") == 90.0 and j.util_pct("z") is None
    assert j.unjoined == ["node-c 0000:18:00.0"]
    assert j.problems == ["DCGM: 1 series without a Hostname label were left out (cannot join them to a server)",
                          "DCGM: 1 series without a pci_bus_id label were left out (cannot join them to a server)"]


def test_phase_split_per_server_from_counter_rates():
    q = prom_phases.query("30s")
    assert 'rate(specdecode:iterations_total{rank="0"}[30s])' in q and q.count(" or ") == 2
    series = [({"instance": "a", "what": "iterations"}, 50.0),
              ({"instance": "a", "what": "phase", "phase": "draft"}, 0.5),
              ({"instance": "a", "what": "comm", "phase": "draft"}, 0.1),
              ({"instance": "a", "what": "comm", "phase": "draft_extend"}, 0.1),
              ({"instance": "s", "what": "iterations"}, 10.0),
              ({"instance": "s", "what": "phase", "phase": "verify"}, 0.2),
              ({"instance": "idle", "what": "iterations"}, 0.0)]
    out = prom_phases.split(series)
    assert out["a"].wall_ms == 20.0 and out["a"].phase_ms == {"draft": 10.0}
    assert out["a"].comm_ms == {"draft": 2.0, "draft_extend": 2.0} and out["a"].draft_comm_pct == 20.0
    assert out["s"].phase_ms == {"verify": 20.0} and out["s"].draft_comm_pct is None   # SGLang: no comm split
    assert out["idle"].draft_comm_pct is None and math.isnan(out["idle"].wall_ms)


def _m(name, instance):
    return Member(name, f"http://{name}", source="prometheus", labels={"instance": instance})


def test_a_follower_is_grouped_under_the_leader_with_room_for_its_ranks():
    lead, other, fol = _m("lead:30000", "lead:30000"), _m("other:30000", "other:30000"), _m("f:30001", "f:30001")
    roles = {"lead:30000": (SERVER, {"nnodes": 2, "tp_size": 4}), "other:30000": (SERVER, {"nnodes": 1, "tp_size": 2}),
             "f:30001": (FOLLOWER, None)}
    ranks = {"lead:30000": [{"host": "n0", "tp_rank": "0"}, {"host": "n0", "tp_rank": "1"}],
             "other:30000": [{"host": "n9", "tp_rank": "0"}],
             "f:30001": [{"host": "n1", "tp_rank": "2"}, {"host": "n1", "tp_rank": "3"}]}
    g = plan([lead, other, fol], roles, ranks)
    assert [m.name for m in g.members] == ["lead:30000", "other:30000"]
    assert g.followers == {"lead:30000": ["f:30001"]} and g.members[0].labels["followers"] == "f:30001"
    assert g.notes == []
    # A leader whose rank_info names the follower's host wins outright.
    ranks2 = dict(ranks, **{"other:30000": [{"host": "n9", "tp_rank": "0"}, {"host": "n1", "tp_rank": "2"}]})
    assert plan([lead, other, fol], roles, ranks2).followers == {"other:30000": ["f:30001"]}
    # Two leaders with room: not a non-server, not guessed either.
    roles3 = dict(roles, **{"other:30000": (SERVER, {"nnodes": 2, "tp_size": 4})})
    g3 = plan([lead, other, fol], roles3, ranks)
    assert g3.followers == {} and [m.name for m in g3.members] == ["lead:30000", "other:30000"]
    assert len(g3.notes) == 1 and "one of lead:30000, other:30000" in g3.notes[0]


def _series(name, points, **labels):
    return {"__name__": name, "instance": "a:1", "job": "sglang", **labels}, points


def test_report_data_from_a_range_answer_derives_rates_settings_and_outages():
    ts = [1000.0 + i for i in range(12)]
    up = ts[:5] + ts[8:]                   # nothing at 1005..1007: the server was not scraped
    steps = [(t, 3.0 if t < 1009 else 5.0) for t in up]
    matrix = [
        _series("sglang:realtime_tokens_total", [(t, 100.0 * (t - 1000)) for t in up], mode="decode", tp_rank="0"),
        _series("sglang:spec_num_steps", steps, tp_rank="0"),
        _series("specdecode:iterations_total", [(t, 10.0 * (t - 1000)) for t in up], rank="0"),
        _series("specdecode:phase_seconds_total", [(t, 0.5 * (t - 1000)) for t in up], rank="0", phase="verify"),
    ]
    d = build(matrix, 1000.0, 1011.0, 1.0, "a:1")
    assert d.header["active"] == {"speculative_num_steps": 3}
    tok = d.get("server/tok_per_s")
    assert list(tok.v) and all(v == 100.0 for v in tok.v)
    assert set(d.get("phase/verify_ms").v) == {50.0}
    kinds = [(e.kind, e.t) for e in d.event_list]
    assert ("disconnected", 4.0) in kinds and ("connected", 8.0) in kinds and ("config_changed", 9.0) in kinds
    assert (d.t_first, d.t_last) == (0.0, 11.0)


def test_report_times():
    assert parse_time("now", 5000.0) == 5000.0 and parse_time("now-15m", 5000.0) == 4100.0
    assert parse_time("90", 5000.0) == 90.0 and parse_time("1h", 5000.0) == 1400.0
    assert parse_time("1970-01-01T00:01:00Z", 0.0) == 60.0
    with pytest.raises(PrometheusError):
        parse_time("yesterday", 0.0)
