"""Prometheus text parsing: what prometheus_client writes is read back exactly (hypothesis), and
garbage of any kind is one MetricsParseError line, never another exception."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tuner.backends.promtext import MetricSet, MetricsParseError, parse_metrics, rank_info, tail_counts

label_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                       max_size=12)
values = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.tuples(label_values, st.sampled_from(["decode", "prefill_compute"])), values,
                       min_size=1, max_size=6),
       values)
def test_what_prometheus_client_writes_reads_back(counters, gauge):
    reg = CollectorRegistry()
    c = Counter("sglang:realtime_tokens", "doc", ["model_name", "mode"], registry=reg)
    for (model, mode), v in counters.items():
        c.labels(model_name=model, mode=mode).inc(v)
    Gauge("sglang:gen_throughput", "doc", registry=reg).set(gauge)
    ms = parse_metrics(generate_latest(reg).decode())
    for (model, mode), v in counters.items():
        assert ms.value("sglang:realtime_tokens_total", model_name=model, mode=mode) == pytest.approx(v, rel=1e-12)
    assert ms.value("sglang:realtime_tokens_total", mode="decode") == pytest.approx(
        sum(v for (_, mode), v in counters.items() if mode == "decode"), rel=1e-9) or \
        not any(mode == "decode" for _, mode in counters)
    assert ms.value("sglang:gen_throughput") == pytest.approx(gauge)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1"))))
def test_garbage_never_raises_anything_else(text):
    try:
        ms = parse_metrics(text)
    except MetricsParseError as e:
        assert "\n" not in str(e) and str(e).startswith("/metrics")
        return
    assert isinstance(ms, MetricSet)
    for name in ms.names():
        ms.value(name)     # lookups on whatever parsed never raise


@pytest.mark.parametrize("body,needle", [
    ("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "HTML"),
    ('{"error": "nope"}', "JSON"),
    ("sglang:x{a=\"1\"} not_a_number\n", "not valid"),
])
def test_named_garbage(body, needle):
    with pytest.raises(MetricsParseError, match=needle):
        parse_metrics(body)


def test_lowest_tp_rank_only_and_missing_is_nan():
    ms = parse_metrics('sglang:gen_throughput{tp_rank="0"} 10\nsglang:gen_throughput{tp_rank="1"} 10\n'
                       'sglang:gen_throughput{tp_rank="10"} 99\n')
    assert ms.value("sglang:gen_throughput") == 10
    assert math.isnan(ms.value("sglang:nothing"))


def test_tail_counts_and_rank_info():
    ms = parse_metrics('specdecode:accept_position_total{k="2"} 3\nspecdecode:accept_position_total{k="0"} 9\n'
                       'specdecode:accept_position_total{k="x"} 1\n'
                       'specdecode:rank_info{tp_rank="1",pid="8",pci_bus_id="0000:19:00.0",host="h"} 1\n'
                       'specdecode:rank_info{tp_rank="0",pid="7",pci_bus_id="0000:18:00.0",host="h"} 1\n')
    assert tail_counts(ms, "specdecode:accept_position_total") == [9.0, 0.0, 3.0]
    assert [r["pid"] for r in rank_info(ms)] == ["7", "8"]
    assert tail_counts(ms, "absent") == []
