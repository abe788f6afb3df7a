"""/metrics in Prometheus text format: SGLang's `sglang:*` names and labels plus ours under `specdecode:`.

Request-level series are real prometheus_client instruments updated as requests finish; engine-level
series are rendered at scrape time from one snapshot dict (see `Snapshot keys` below) by a custom
collector. Must not call the engine itself: the app passes a function that builds the snapshot.

Snapshot keys (all optional; a missing key leaves its series out rather than inventing a value):
  num_running_reqs, num_queue_reqs, token_usage, num_used_tokens, spec_num_steps, spec_eagle_topk,
  spec_num_draft_tokens, placement, epoch, emulated_comm, simulated_accept,
  decode_tokens, forward_seconds{category: s}, accept_position{k: n}, accept_len, accept_rate,
  gen_throughput, phase_seconds{(phase, rank): s}, phase_comm_seconds{(phase, rank): s},
  phase_comm_calls{(phase, rank): n}, rank_info[{tp_rank, pid, pci_bus_id, host}]
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from refengine.server.options import PLACEMENTS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENGINE_TYPE = "unified"  # SGLang's engine_type label for a non-disaggregated server

# SGLang's tokenizer-side latency buckets are long-tailed; these cover a CPU engine too.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300)


class _EngineCollector(Collector):
    def __init__(self, model_name: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.model_name = model_name
        self.snapshot = snapshot
        # SGLang's scheduler labels (metrics_collector.py): only the stats rank (TP0) reports.
        self.sched_names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        self.sched_values = [model_name, ENGINE_TYPE, "0", "0", "0"]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=self.sched_names)
        g.add_metric(self.sched_values, float(value))
        return g

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot()
        gauges = [
            ("num_running_reqs", "sglang:num_running_reqs", "The number of running requests."),
            ("num_queue_reqs", "sglang:num_queue_reqs", "The number of requests in the waiting queue."),
            ("token_usage", "sglang:token_usage", "The token usage."),
            ("num_used_tokens", "sglang:num_used_tokens", "The number of used tokens."),
            ("gen_throughput", "sglang:gen_throughput", "The generation throughput (token/s)."),
            ("accept_len", "sglang:spec_accept_length", "The average acceptance length of speculative decoding."),
            ("accept_rate", "sglang:spec_accept_rate", "The average acceptance rate of speculative decoding."),
            ("spec_num_steps", "sglang:spec_num_steps", "The active speculative_num_steps."),
            ("spec_num_draft_tokens", "sglang:spec_num_draft_tokens", "The active speculative_num_draft_tokens."),
        ]
        for key, name, doc in gauges:
            if key in s:
                yield self._gauge(name, doc, s[key])

        if "decode_tokens" in s:
            c = CounterMetricFamily("sglang:realtime_tokens", "Tokens processed, updated every iteration.",
                                    labels=self.sched_names + ["mode"])
            c.add_metric(self.sched_values + ["decode"], float(s["decode_tokens"]))
            yield c
        if "forward_seconds" in s:
            c = CounterMetricFamily("sglang:forward_execution_seconds",
                                    "Forward execution time by category (engine-timed, comm included).",
                                    labels=self.sched_names + ["category"])
            for cat in ("eagle_draft", "eagle_draft_extend", "target_verify", "decode"):
                c.add_metric(self.sched_values + [cat], float(s["forward_seconds"].get(cat, 0.0)))
            yield c

        yield from self._ours(s)

    def _ours(self, s: dict[str, Any]) -> Iterator[Metric]:
        for key, name, doc in (
            ("phase_seconds", "specdecode:phase_seconds", "Inclusive time per decode phase and rank."),
            ("phase_comm_seconds", "specdecode:phase_comm_seconds", "Time in collectives per decode phase and rank."),
            ("phase_comm_calls", "specdecode:phase_comm_calls", "Collective calls per decode phase and rank."),
        ):
            if key in s:
                c = CounterMetricFamily(name, doc, labels=["phase", "rank"])
                for (phase, rank), v in sorted(s[key].items()):
                    c.add_metric([str(phase), str(rank)], float(v))
                yield c
        if "accept_position" in s:
            c = CounterMetricFamily(
                "specdecode:accept_position",
                "Request-verify rounds that accepted at least k drafts (k=0: all rounds).", labels=["k"])
            for k, v in sorted(s["accept_position"].items()):
                c.add_metric([str(k)], float(v))
            yield c
        if "rank_info" in s:
            g = GaugeMetricFamily("specdecode:rank_info", "One series per TP rank process (value 1).",
                                  labels=["tp_rank", "pid", "pci_bus_id", "host"])
            for r in s["rank_info"]:
                g.add_metric([str(r.get("tp_rank", "")), str(r.get("pid", "")),
                              str(r.get("pci_bus_id") or ""), str(r.get("host", ""))], 1.0)
            yield g
        if "placement" in s:
            g = GaugeMetricFamily("specdecode:draft_placement", "1 for the active draft placement.",
                                  labels=["placement"])
            for p in PLACEMENTS:
                g.add_metric([p], 1.0 if s["placement"] == p else 0.0)
            yield g
        for key, name, doc in (
            ("spec_eagle_topk", "specdecode:spec_eagle_topk", "The active speculative_eagle_topk."),
            ("epoch", "specdecode:config_epoch", "The active configuration's epoch."),
            ("emulated_comm", "specdecode:emulated_comm", "1 when collectives carry an emulated latency."),
            ("simulated_accept", "specdecode:simulated_accept", "1 when the acceptance simulator is on."),
        ):
            if key in s and s[key] is not None:
                yield GaugeMetricFamily(name, doc, value=float(s[key]))


class Metrics:
    """The registry behind /metrics; request-level instruments are updated by the handlers."""

    def __init__(self, model_name: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(model_name, snapshot))
        self.labels = {"model_name": model_name, "engine_type": ENGINE_TYPE}
        names = list(self.labels)
        # SGLang splits the tokenizer-side request series by "is_streaming" ("true"/"false";
        # metrics_collector.py:1855-1864, 1941-1945, 2041-2072, filled at 2105-2108); the verify
        # counter keeps the plain labels (:1865-1869).
        streamed = names + ["is_streaming"]

        def counter(name: str, doc: str, labelnames: list[str]) -> Counter:
            return Counter(name, doc, labelnames, registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, streamed, buckets=LATENCY_BUCKETS, registry=self.registry)

        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", streamed)
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         streamed)
        self.num_requests = counter("sglang:num_requests_total", "Number of requests processed.", streamed)
        self.spec_verify_calls = counter("sglang:spec_verify_calls_total", "Verify rounds of finished requests.",
                                         names).labels(**self.labels)
        self.e2e_latency = histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency.")
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Time to first token.")

    def request_finished(self, prompt_tokens: int, completion_tokens: int, verify_ct: int,
                         e2e_s: float, ttft_s: float | None, streaming: bool = False) -> None:
        lab = {**self.labels, "is_streaming": "true" if streaming else "false"}
        self.num_requests.labels(**lab).inc()
        self.prompt_tokens.labels(**lab).inc(prompt_tokens)
        self.generation_tokens.labels(**lab).inc(completion_tokens)
        self.spec_verify_calls.inc(verify_ct)
        self.e2e_latency.labels(**lab).observe(e2e_s)
        if ttft_s is not None:
            self.ttft.labels(**lab).observe(ttft_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
