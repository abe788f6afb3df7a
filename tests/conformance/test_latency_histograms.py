"""SGLang 0.5.23's latency histograms in /metrics: names, labels, bucket bounds, what one output
observes, and no `*_created` series. One row per histogram.

SGLang source: `sglang/srt/observability/metrics_collector.py` (the collectors and their default
buckets), `sglang/srt/managers/tokenizer_manager.py` (collect_metrics: when each is observed) and
`sglang/srt/observability/req_time_stats.py` (the queue time, TPOT) of the 0.5.23 wheel.
`tests/sglang/test_sglang_contract.py` reads the same lists out of the wheel itself.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from refengine.server import outputs
from refengine.server.inputs import Sampling
from refengine.server.metrics import (E2E_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS, TTFT_BUCKETS, Metrics)
from tests.conformance.serve_probe import PROMPT_IDS, wait_settled

SCHED = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
TOK = {"model_name", "engine_type"}
STREAM = TOK | {"is_streaming"}

# (family, label names, upper bounds without +Inf, SGLang 0.5.23 metrics_collector.py lines)
ROWS = [
    ("sglang:time_to_first_token_seconds", STREAM,
     [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400], ":1966-1985, 2040-2048"),
    ("sglang:inter_token_latency_seconds", TOK,
     [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
      0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000], ":2014-2038, 2050-2055"),
    ("sglang:request_time_per_output_token_seconds", STREAM,
     [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
      0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000], ":2014-2038, 2057-2065"),
    ("sglang:e2e_request_latency_seconds", STREAM,
     [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400],
     ":1988-2011, 2067-2072"),
    ("sglang:queue_time_seconds", SCHED,
     [0.000, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70,
      80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000],
     ":837-883 (labels :1383-1389)"),
]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def rendered():
    m = Metrics("tiny", lambda: {})
    m.first_token(0.3, streaming=True)
    m.tokens(0.03, 3)
    m.queued(0.02)
    m.request_finished(prompt_tokens=5, completion_tokens=4, verify_ct=2, e2e_s=0.5, tpot_s=0.05, streaming=True)
    return m.render().decode()


@pytest.mark.parametrize("name, labels, bounds, where", ROWS, ids=[r[0] for r in ROWS])
def test_histogram(rendered, name, labels, bounds, where):
    fam = families(rendered)[name]
    assert fam.type == "histogram", where
    got = {frozenset(k for k in s.labels if k != "le") for s in fam.samples}
    assert got == {frozenset(labels)}, where
    les = [float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")]
    assert les == [float(b) for b in bounds] + [float("inf")], where


def test_module_lists_are_the_table():
    assert [list(b) for b in (TTFT_BUCKETS, ITL_BUCKETS, E2E_BUCKETS, QUEUE_BUCKETS)] == \
        [ROWS[0][2], ROWS[1][2], ROWS[3][2], ROWS[4][2]]


def test_no_created_series(rendered):
    """SGLang serves /metrics through prometheus_client's multiprocess collector, which has no
    `*_created` samples (sglang/srt/utils/common.py add_prometheus_middleware)."""
    assert "_created" not in rendered


def test_inter_token_latency_is_spread_over_the_new_tokens(rendered):
    """tokenizer_manager.py:3248-3256 with metrics_collector.py:2161-2178: an output of 3 new
    tokens 30 ms after the previous one is 3 observations of 10 ms; the sum grows by 30 ms."""
    fam = families(rendered)["sglang:inter_token_latency_seconds"]
    by = {s.name: s for s in fam.samples if "le" not in s.labels or s.labels["le"] in ("0.008", "0.01")}
    assert by["sglang:inter_token_latency_seconds_count"].value == 3
    assert by["sglang:inter_token_latency_seconds_sum"].value == pytest.approx(0.03)
    le = {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}
    assert le["0.008"] == 0 and le["0.01"] == 3


class _Seen:
    """A recorder of what RequestOutput tells its observer (a unit test of pure bookkeeping)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def first_token(self, ttft_s):
        self.calls.append(("ttft", ttft_s))

    def tokens(self, interval_s, new_tokens):
        self.calls.append(("itl", interval_s, new_tokens))

    def queued(self, queue_s):
        self.calls.append(("queue", queue_s))


def _out(clock: list[float], monkeypatch) -> tuple[outputs.RequestOutput, _Seen]:
    monkeypatch.setattr(outputs.time, "time", lambda: clock[0])
    seen = _Seen()
    out = outputs.RequestOutput(rid="r", prompt_tokens=3, sampling=Sampling(max_new_tokens=8),
                                decode=lambda ids: "x" * len(ids), latency=seen,
                                created=clock[0])
    return out, seen


def test_each_output_is_observed_as_sglang_does(monkeypatch):
    clock = [100.0]
    out, seen = _out(clock, monkeypatch)
    clock[0] = 100.5
    out.add([7], forward_entry=100.2)                       # the prefill's token
    clock[0] = 100.8
    out.add([1, 2, 3])                                      # one verify round, three tokens
    clock[0] = 100.9
    out.add([])                                             # nothing new: nothing observed
    clock[0] = 101.0
    out.add([4], finished=True, reason="length")
    assert seen.calls == [("queue", pytest.approx(0.2)), ("ttft", pytest.approx(0.5)),
                          ("itl", pytest.approx(0.3), 3), ("itl", pytest.approx(0.2), 1)]
    # TPOT: (finished - first token) / (completion - 1) = 0.5 / 4 (req_time_stats.py:492-498).
    assert out.time_per_output_token() == pytest.approx(0.125)


def test_an_abort_gives_no_ttft_and_no_tpot(monkeypatch):
    """collect_metrics observes TTFT only for an output that is not an abort (:3235-3247) and TPOT
    only for stop and length (:3277-3284)."""
    clock = [10.0]
    out, seen = _out(clock, monkeypatch)
    clock[0] = 11.0
    out.add([5, 6], finished=True, reason="abort")
    assert seen.calls == [] and out.time_per_output_token() is None


def test_a_real_stream_fills_the_histograms(tp2_server):
    """On the shared TP2 server: one streamed request of 12 tokens adds one TTFT (is_streaming
    "true"), one queue time, one TPOT and 11 inter-token observations (every token after the
    first), and /metrics has no `*_created` line."""
    with httpx.Client(base_url=tp2_server.url, timeout=120) as http:
        wait_settled(http)

        def counts() -> dict[str, float]:
            out = {}
            for fam in text_string_to_metric_families(http.get("/metrics").text):
                for s in fam.samples:
                    if s.name.endswith("_count") and s.labels.get("is_streaming", "true") == "true":
                        out[s.name] = out.get(s.name, 0.0) + s.value
            return out

        before = counts()
        sp = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
        with http.stream("POST", "/generate", json={"input_ids": PROMPT_IDS, "sampling_params": sp,
                                                     "stream": True}) as r:
            assert r.status_code == 200
            lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
        assert lines[-1].strip() == "data: [DONE]"
        after = counts()
        text = http.get("/metrics").text
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert delta["sglang:time_to_first_token_seconds_count"] == 1
    assert delta["sglang:inter_token_latency_seconds_count"] == 11
    assert delta["sglang:request_time_per_output_token_seconds_count"] == 1
    assert delta["sglang:queue_time_seconds_count"] == 1
    assert "_created" not in text
