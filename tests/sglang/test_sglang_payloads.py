"""The recorded-shape SGLang payload fixtures agree with SGLang's source, with each other, and
with what our own readers make of them (the team's Prometheus parser, trace analyser, and the
plugin's /specdecode/phases reply)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probes.inserver.sglang_plugin import phases_reply
from probes.inserver.sglang_stream import RingWriter
from probes.trace_analysis import analyze_path
from tuner.backends import detect_kind
from tuner.backends.promtext import parse_metrics
from sglang_wheel_code import parse, top_level

FIX = Path(__file__).parent / "fixtures"


def _json(name):
    return json.loads((FIX / name).read_text())


def test_metrics_parse_and_rates_tell_the_scenario():
    t0 = parse_metrics((FIX / "metrics_t0.txt").read_text())
    t1 = parse_metrics((FIX / "metrics_t1.txt").read_text())
    d = lambda name, **m: t1.value(name, **m) - t0.value(name, **m)   # noqa: E731
    assert d("sglang:realtime_tokens_total", mode="decode") == 299
    assert d("specdecode:iterations_total", rank="0") == 22
    ms = {p: d("specdecode:phase_seconds_total", phase=p, rank="0") / 22 * 1e3
          for p in ("draft", "verify", "verify_sample", "draft_extend", "other")}
    assert ms == pytest.approx({"draft": 12.0, "verify": 24.0, "verify_sample": 2.5,
                                "draft_extend": 4.5, "other": 1.5})
    pos = [d("specdecode:accept_position_total", k=str(k)) for k in range(5)]
    assert pos == [88, 80, 66, 46, 19]
    assert 1 + sum(pos[1:]) / pos[0] == pytest.approx(3.40, abs=0.01)   # tau from p_k
    assert t1.value("sglang:spec_num_steps") == 4 and t1.value("sglang:spec_num_draft_tokens") == 5
    assert d("sglang:forward_execution_seconds_total", category="target_verify") == pytest.approx(0.515)
    ranks = [lab for lab, _ in t1.samples("specdecode:rank_info")]
    assert sorted(int(lab["tp_rank"]) for lab in ranks) == list(range(8))
    assert all(lab["pid"] and lab["pci_bus_id"] and lab["host"] for lab in ranks)


def test_metrics_without_plugin_or_device_timer():
    m = parse_metrics((FIX / "metrics_no_plugin.txt").read_text())
    assert not m.has_prefix("specdecode:")
    assert "sglang:forward_execution_seconds_total" not in m
    assert m.value("sglang:spec_accept_length") == 3.48


def test_metric_names_in_fixtures_exist_in_sglang(sglang_src):
    text = (sglang_src / "srt/observability/metrics_collector.py").read_text()
    for body in ("metrics_t1.txt", "metrics_no_plugin.txt"):
        for name in parse_metrics((FIX / body).read_text()).names():
            if name.startswith("sglang:"):
                assert f'name="{name}"' in text, name


def test_server_info_is_sglang_shaped(sglang_src):
    spec_fields = {n.target.id for n in top_level(parse(sglang_src, "sglang.srt.arg_groups.fields.spec"))
                   ["Spec"].body if hasattr(n, "target")}
    for name in ("server_info_adaptive.json", "server_info_static.json"):
        info = _json(name)
        assert detect_kind(info) == "sglang" and info["version"] == "0.5.23"
        assert isinstance(info["launch_command"], str) and "--tp-size 8" in info["launch_command"]
        assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1
        for key in (k for k in info if k.startswith("speculative_")):
            assert key in spec_fields, key
    a = _json("server_info_adaptive.json")
    st = a["internal_states"][0]
    # launch values at the top level never change; the active adaptive tier is in internal_states
    assert (a["speculative_num_steps"], st["speculative_num_steps"]) == (3, 4)
    assert st["speculative_num_draft_tokens"] == st["speculative_num_steps"] + 1
    assert set(st["memory_usage"]["graph"]) == {"decode", "target_verify", "draft_decode", "draft_extend"}
    s = _json("server_info_static.json")
    assert (s["speculative_num_steps"], s["speculative_eagle_topk"], s["speculative_num_draft_tokens"]) == (5, 4, 8)


def test_generate_meta_info_arithmetic():
    r = _json("generate_response.json")
    m = r["meta_info"]
    h = m["spec_correct_drafts_histogram"]
    assert sum(h) == m["spec_verify_ct"]
    assert sum(k * n for k, n in enumerate(h)) == m["spec_num_correct_drafts"]
    assert m["spec_accept_length"] == pytest.approx(m["completion_tokens"] / m["spec_verify_ct"])
    assert m["spec_accept_rate"] == pytest.approx(
        m["spec_num_correct_drafts"] / m["spec_num_proposed_drafts"])
    assert len(r["output_ids"]) == m["completion_tokens"]


def test_stream_chunks_are_cumulative_with_spec_keys_last():
    events = [e for e in (FIX / "generate_stream.txt").read_text().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    lens = [len(c["output_ids"]) for c in chunks]
    assert lens == sorted(lens) and chunks[-1] == _json("generate_response.json") | {
        "text": chunks[-1]["text"]}
    assert all("spec_verify_ct" not in c["meta_info"] for c in chunks[:-1])
    assert all(c["output_ids"] == chunks[-1]["output_ids"][:len(c["output_ids"])] for c in chunks)


def test_phases_reply_fixture_is_what_the_plugin_route_serves(tmp_path):
    fixture = _json("phases_reply.json")
    w = RingWriter(tmp_path, 0, 0)
    w.write([{"seq": s, "t": 0.0} for s in range(1, 1001)] + fixture["records"])
    status, body = phases_reply({"after": "1000", "limit": "3"}, tmp_path)
    assert status == 200 and body == fixture
    for r in fixture["records"]:
        assert sum(r["phase_ms"].values()) == pytest.approx(r["wall_ms"])
        assert r["committed"] == sum(r["accepted"]) + len(r["accepted"])


def test_trace_fixture_splits_into_phases_with_comm():
    res = analyze_path(FIX / "sglang_tp2_plugin")
    assert len(res.ranks) == 2
    for rank in res.ranks:
        assert rank.mode == "gpu" and rank.unattributed_kernels == 0 and len(rank.iterations) == 2
        it = rank.iterations[0]
        for phase in ("draft", "verify", "verify_sample", "draft_extend"):
            assert it.phases[phase].ms > 0, phase
        assert it.phases["draft"].comm_ms > 0 and it.phases["verify"].comm_ms > 0
        assert it.phases["verify_sample"].comm_ms == 0


def test_set_internal_state_reply_fixture_matches_sglangs_shapes(sglang_src):
    r = _json("set_internal_state_replies.json")
    assert r["applied"]["body"] == [True] and r["refused"]["body"] == [False]
    ist = (sglang_src / "srt/managers/scheduler_components/internal_state.py").read_text()
    assert 'f"Updating {key} is not supported."' in ist
    assert r["log"][0].endswith("Updating speculative_num_steps is not supported.")
