"""/metrics text: SGLang names and labels, our specdecode: series, parsed back with prometheus_client."""

from prometheus_client.parser import text_string_to_metric_families

from refengine.server.metrics import Metrics


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams, name):
    return [(s.name, s.labels, s.value) for s in fams[name].samples]


SNAP = {
    "num_running_reqs": 2, "num_queue_reqs": 1, "token_usage": 0.25, "gen_throughput": 50.0,
    "accept_len": 2.5, "accept_rate": 0.5, "spec_num_steps": 3, "spec_num_draft_tokens": 4,
    "spec_eagle_topk": 1, "placement": "rank0", "epoch": 2, "emulated_comm": False, "simulated_accept": False,
    "decode_tokens": 77, "forward_seconds": {"eagle_draft": 1.5, "target_verify": 2.0},
    "accept_position": {0: 10, 1: 7, 2: 3},
    "phase_seconds": {("draft", 0): 1.0, ("draft", 1): 1.1},
    "phase_comm_seconds": {("draft", 0): 0.2, ("draft", 1): 0.3},
    "rank_info": [{"tp_rank": 0, "pid": 11, "pci_bus_id": None, "host": "h"},
                  {"tp_rank": 1, "pid": 12, "pci_bus_id": "0000:01:00.0", "host": "h"}],
}


def test_engine_series_names_and_labels():
    m = Metrics("tiny", lambda: SNAP)
    m.request_finished(prompt_tokens=5, completion_tokens=9, verify_ct=4, e2e_s=0.3, tpot_s=0.01)
    fams = families(m.render().decode())
    (_, labels, v), = samples(fams, "sglang:spec_accept_length")
    assert v == 2.5 and labels == {"model_name": "tiny", "engine_type": "unified", "tp_rank": "0",
                                   "pp_rank": "0", "moe_ep_rank": "0"}
    assert samples(fams, "sglang:spec_num_steps")[0][2] == 3
    rt = samples(fams, "sglang:realtime_tokens")
    assert rt[0][0] == "sglang:realtime_tokens_total" and rt[0][1]["mode"] == "decode" and rt[0][2] == 77
    cats = {s[1]["category"]: s[2] for s in samples(fams, "sglang:forward_execution_seconds")}
    assert cats["eagle_draft"] == 1.5 and cats["eagle_draft_extend"] == 0.0 and cats["target_verify"] == 2.0
    ph = {(s[1]["phase"], s[1]["rank"]): s[2] for s in samples(fams, "specdecode:phase_seconds")}
    assert ph == {("draft", "0"): 1.0, ("draft", "1"): 1.1}
    assert {s[1]["k"]: s[2] for s in samples(fams, "specdecode:accept_position")} == {"0": 10, "1": 7, "2": 3}
    ri = samples(fams, "specdecode:rank_info")
    assert [s[1]["pci_bus_id"] for s in ri] == ["", "0000:01:00.0"] and ri[1][1]["pid"] == "12"
    pl = {s[1]["placement"]: s[2] for s in samples(fams, "specdecode:draft_placement")}
    assert pl == {"sharded": 0.0, "replicated": 0.0, "rank0": 1.0}
    assert [s for s in samples(fams, "sglang:generation_tokens") if s[0].endswith("_total")][0][2] == 9
    assert any(s[0] == "sglang:e2e_request_latency_seconds_count" and s[2] == 1
               for s in samples(fams, "sglang:e2e_request_latency_seconds"))


def test_missing_keys_leave_series_out():
    fams = families(Metrics("tiny", lambda: {}).render().decode())
    assert "sglang:spec_accept_length" not in fams and "specdecode:rank_info" not in fams
    assert "sglang:prompt_tokens" in fams  # request counters exist from the start, at 0
