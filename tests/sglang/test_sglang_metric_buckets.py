"""The latency histograms' bucket bounds in refengine/server/metrics.py against SGLang 0.5.23's
own lists, read out of the wheel's metrics_collector.py (static, via ast).

An SGLang upgrade that moves a bound fails here with the histogram's name.
"""

from __future__ import annotations

import ast

import pytest

from refengine.server.metrics import E2E_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS, TTFT_BUCKETS


def _tree(sglang_src) -> ast.Module:
    return ast.parse((sglang_src / "srt/observability/metrics_collector.py").read_text(encoding="utf-8"))


def _default_list(tree: ast.Module, var: str) -> list[float]:
    """The list assigned to `var` (TokenizerMetricsCollector's `if var is None: var = [...]`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == var for t in node.targets):
            return [float(v) for v in ast.literal_eval(node.value)]
    raise AssertionError(f"{var} not assigned in metrics_collector.py")


def _histogram_buckets(tree: ast.Module, name: str) -> list[float]:
    """The literal `buckets=` of the Histogram(name=NAME, ...) call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(kw.get("name"), ast.Constant) and kw["name"].value == name:
                return [float(v) for v in ast.literal_eval(kw["buckets"])]
    raise AssertionError(f"no Histogram named {name} in metrics_collector.py")


@pytest.mark.parametrize("var, ours", [
    ("bucket_time_to_first_token", TTFT_BUCKETS),
    ("bucket_e2e_request_latency", E2E_BUCKETS),
    ("bucket_inter_token_latency", ITL_BUCKETS),
])
def test_tokenizer_latency_buckets(sglang_src, var, ours):
    assert [float(b) for b in ours] == _default_list(_tree(sglang_src), var)


def test_queue_time_buckets(sglang_src):
    assert [float(b) for b in QUEUE_BUCKETS] == _histogram_buckets(_tree(sglang_src), "sglang:queue_time_seconds")


@pytest.mark.parametrize("name", ["sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                                  "sglang:request_time_per_output_token_seconds",
                                  "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds"])
def test_histogram_names(sglang_src, name):
    from refengine.server.metrics import Metrics

    assert f'name="{name}"' in (sglang_src / "srt/observability/metrics_collector.py").read_text(encoding="utf-8")
    assert name in Metrics("m", lambda: {}).render().decode()
