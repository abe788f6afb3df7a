"""/metrics in Prometheus text format: SGLang's `sglang:*` names and labels plus ours under `specdecode:`.

Request-level series are real prometheus_client instruments updated as each request's outputs arrive
(SGLang's tokenizer_manager.collect_metrics: time to first token on the first output, inter-token
latency on each later one, the rest when it finishes); engine-level series are rendered at scrape
time from one snapshot dict (see `Snapshot keys` below) by a custom collector. The latency
histograms have SGLang 0.5.23's names, labels and bucket bounds (metrics_collector.py, cited at each
list), and no `*_created` series: SGLang serves /metrics from prometheus_client's multiprocess
collector, which has none. Must not call the engine itself: the app passes a function that builds
the snapshot.

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

# SGLang 0.5.23's default bucket bounds (sglang/srt/observability/metrics_collector.py).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)    # :1966-1985
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,     # :1988-2011
               600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,  # :2014-2038
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
"""Inter-token latency and request_time_per_output_token share these (:2054, :2064)."""
QUEUE_BUCKETS = (0.000, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10,   # :841-882
                 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900,
                 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)
SCHED_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
"""SGLang's scheduler labels (metrics_collector.py:1383-1389): only the stats rank (TP0) reports."""


class _NoCreated:
    """The registry's families without their `*_created` samples: SGLang's multiprocess
    collector emits none (and PROMETHEUS_DISABLE_CREATED_SERIES would switch them off for every
    registry of the process, tests' included)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for fam in self.registry.collect():
            fam.samples = [s for s in fam.samples if not s.name.endswith("_created")]
            yield fam


class _EngineCollector(Collector):
    def __init__(self, model_name: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.model_name = model_name
        self.snapshot = snapshot
        self.sched_names = SCHED_LABELS
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
        if s.get("iterations"):
            # The same counter the SGLang plugin exports: phase seconds / iterations = ms per iteration
            # for a reader of /metrics or Prometheus without the phase stream.
            c = CounterMetricFamily("specdecode:iterations", "Decode iterations per rank.", labels=["rank"])
            for rank, n in sorted(s["iterations"].items()):
                c.add_metric([str(rank)], float(n))
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
        # counter and the inter-token latency keep the plain labels (:1865-1869, :2053).
        streamed = names + ["is_streaming"]

        def counter(name: str, doc: str, labelnames: list[str]) -> Counter:
            return Counter(name, doc, labelnames, registry=self.registry)

        def histogram(name: str, doc: str, labelnames: list[str], buckets: tuple) -> Histogram:
            return Histogram(name, doc, labelnames, buckets=buckets, registry=self.registry)

        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", streamed)
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         streamed)
        self.num_requests = counter("sglang:num_requests_total", "Number of requests processed.", streamed)
        self.spec_verify_calls = counter("sglang:spec_verify_calls_total", "Verify rounds of finished requests.",
                                         names).labels(**self.labels)
        self.e2e_latency = histogram("sglang:e2e_request_latency_seconds",
                                     "Histogram of End-to-end request latency in seconds", streamed, E2E_BUCKETS)
        self.ttft = histogram("sglang:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", streamed, TTFT_BUCKETS)
        self.itl = histogram("sglang:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", names, ITL_BUCKETS).labels(**self.labels)
        self.tpot = histogram("sglang:request_time_per_output_token_seconds",
                              "Per-request TPOT in seconds: (finished_time - first_token_time) / "
                              "(completion_tokens - 1).", streamed, ITL_BUCKETS)
        # Scheduler-side (metrics_collector.py:837-883), with the scheduler's labels.
        self.queue_time = histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                                    SCHED_LABELS, QUEUE_BUCKETS).labels(model_name, ENGINE_TYPE, "0", "0", "0")

    def _stream(self, streaming: bool) -> dict[str, str]:
        return {**self.labels, "is_streaming": "true" if streaming else "false"}

    def first_token(self, ttft_s: float, streaming: bool) -> None:
        """A request's first output (not an abort): SGLang observes TTFT then, not at the end
        (tokenizer_manager.py:3235-3247)."""
        self.ttft.labels(**self._stream(streaming)).observe(ttft_s)

    def tokens(self, interval_s: float, new_tokens: int) -> None:
        """A later output of `new_tokens` tokens, `interval_s` after the previous one: SGLang
        observes interval / new_tokens once per token, and the sum grows by the whole interval
        (tokenizer_manager.py:3248-3256, metrics_collector.py:2161-2178)."""
        if new_tokens <= 0:
            return
        each = interval_s / new_tokens
        for _ in range(new_tokens):
            self.itl.observe(each)

    def queued(self, queue_s: float) -> None:
        """One request's wait before its first forward (req_time_stats.py:802-813)."""
        self.queue_time.observe(max(0.0, queue_s))

    def request_finished(self, prompt_tokens: int, completion_tokens: int, verify_ct: int,
                         e2e_s: float, tpot_s: float | None = None, streaming: bool = False) -> None:
        """SGLang's observe_one_finished_request (metrics_collector.py:2092-2152); `tpot_s` only
        for a request that finished by stop or length with more than one token (:3277-3284)."""
        lab = self._stream(streaming)
        self.num_requests.labels(**lab).inc()
        self.prompt_tokens.labels(**lab).inc(prompt_tokens)
        self.generation_tokens.labels(**lab).inc(completion_tokens)
        self.spec_verify_calls.inc(verify_ct)
        self.e2e_latency.labels(**lab).observe(e2e_s)
        if tpot_s is not None:
            self.tpot.labels(**lab).observe(tpot_s)

    def observer(self, streaming: bool) -> "RequestLatency":
        """What one counted request tells its latencies to (RequestOutput.latency)."""
        return RequestLatency(self, streaming)

    def render(self) -> bytes:
        return generate_latest(_NoCreated(self.registry))


class RequestLatency:
    """One request's latency facts into the server's histograms, with its is_streaming."""

    def __init__(self, metrics: Metrics, streaming: bool) -> None:
        self.metrics, self.streaming = metrics, streaming

    def first_token(self, ttft_s: float) -> None:
        self.metrics.first_token(ttft_s, self.streaming)

    def tokens(self, interval_s: float, new_tokens: int) -> None:
        self.metrics.tokens(interval_s, new_tokens)

    def queued(self, queue_s: float) -> None:
        self.metrics.queued(queue_s)
