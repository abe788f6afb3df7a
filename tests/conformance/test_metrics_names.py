"""`/metrics` names, types and label names against SGLang 0.5.23, one row per series.

SGLang source: `sglang/srt/observability/metrics_collector.py` of the 0.5.23 wheel. Scheduler
series carry the scheduler labels (model_name, engine_type, tp_rank, pp_rank, moe_ep_rank); the
tokenizer-side request series carry model_name/engine_type plus `is_streaming` ("true"/"false",
filled at :2105-2108), except the verify counter. Our own series live under `specdecode:`.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from refengine.server.metrics import Metrics

SCHED = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
TOK = {"model_name", "engine_type"}
STREAM = TOK | {"is_streaming"}

# (family name as the parser reports it, type, label names, SGLang line)
ROWS = [
    ("sglang:num_running_reqs", "gauge", SCHED, ":365"),
    ("sglang:num_queue_reqs", "gauge", SCHED, ":371"),
    ("sglang:gen_throughput", "gauge", SCHED, ":383"),
    ("sglang:token_usage", "gauge", SCHED, ":405"),
    ("sglang:num_used_tokens", "gauge", SCHED, ":433"),
    ("sglang:spec_accept_length", "gauge", SCHED, ":512"),
    ("sglang:spec_accept_rate", "gauge", SCHED, ":518"),
    ("sglang:spec_num_steps", "gauge", SCHED, ":536"),
    ("sglang:spec_num_draft_tokens", "gauge", SCHED, ":542"),
    ("sglang:realtime_tokens", "counter", SCHED | {"mode"}, ":1033-1038"),
    ("sglang:forward_execution_seconds", "counter", SCHED | {"category"}, ":1055-1060"),
    ("sglang:prompt_tokens", "counter", STREAM, ":1855-1859"),
    ("sglang:generation_tokens", "counter", STREAM, ":1860-1864"),
    ("sglang:spec_verify_calls", "counter", TOK, ":1865-1869"),
    ("sglang:num_requests", "counter", STREAM, ":1941-1945"),
    ("sglang:time_to_first_token_seconds", "histogram", STREAM, ":2040-2048"),
    ("sglang:inter_token_latency_seconds", "histogram", TOK, ":2050-2055"),
    ("sglang:request_time_per_output_token_seconds", "histogram", STREAM, ":2057-2065"),
    ("sglang:e2e_request_latency_seconds", "histogram", STREAM, ":2067-2072"),
    ("sglang:queue_time_seconds", "histogram", SCHED, ":837-883"),
    # Bucket bounds: tests/conformance/test_latency_histograms.py.
    # Ours (docs/ARCHITECTURE.md "Names and contracts").
    ("specdecode:phase_seconds", "counter", {"phase", "rank"}, "-"),
    ("specdecode:accept_position", "counter", {"k"}, "-"),
    ("specdecode:rank_info", "gauge", {"tp_rank", "pid", "pci_bus_id", "host"}, "-"),
]

SNAP = {
    "num_running_reqs": 2, "num_queue_reqs": 1, "token_usage": 0.25, "num_used_tokens": 40, "gen_throughput": 50.0,
    "accept_len": 2.5, "accept_rate": 0.5, "spec_num_steps": 3, "spec_num_draft_tokens": 4,
    "decode_tokens": 77, "forward_seconds": {"eagle_draft": 1.5}, "accept_position": {0: 10, 1: 7},
    "phase_seconds": {("draft", 0): 1.0},
    "rank_info": [{"tp_rank": 0, "pid": 11, "pci_bus_id": None, "host": "h"}],
}


@pytest.fixture(scope="module")
def families():
    m = Metrics("tiny", lambda: SNAP)
    m.first_token(0.1, streaming=True)
    m.tokens(0.02, 2)
    m.queued(0.01)
    m.request_finished(prompt_tokens=5, completion_tokens=9, verify_ct=4, e2e_s=0.3, tpot_s=0.02, streaming=True)
    m.request_finished(prompt_tokens=3, completion_tokens=2, verify_ct=1, e2e_s=0.2, tpot_s=0.1, streaming=False)
    return {f.name: f for f in text_string_to_metric_families(m.render().decode())}


@pytest.mark.parametrize("name, kind, labels, where", ROWS, ids=[r[0] for r in ROWS])
def test_series(families, name, kind, labels, where):
    fam = families[name]
    assert fam.type == kind, where
    got = {frozenset(k for k in s.labels if k not in ("le", "quantile")) for s in fam.samples}
    assert got == {frozenset(labels)}, where


def test_is_streaming_splits_the_request_series(families):
    """metrics_collector.py:2105-2108: one series per is_streaming value, "true" or "false"."""
    by = {s.labels["is_streaming"]: s.value for s in families["sglang:generation_tokens"].samples
          if s.name.endswith("_total")}
    assert by == {"true": 9.0, "false": 2.0}
    counts = {s.labels["is_streaming"]: s.value for s in families["sglang:e2e_request_latency_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {"true": 1.0, "false": 1.0}
    verify = [s.value for s in families["sglang:spec_verify_calls"].samples if s.name.endswith("_total")]
    assert verify == [5.0]
