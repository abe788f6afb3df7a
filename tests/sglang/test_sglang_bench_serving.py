"""SGLang 0.5.23's own benchmark client, `python -m sglang.bench_serving`, works unchanged on `serve`.

Its native (`sglang`), OpenAI (`sglang-oai`) and OpenAI-chat (`sglang-oai-chat`) backends run
against the session's TP 2 server, and every request must finish with the exact output token
count: by the client's own count, by re-tokenizing the text, and by the server's counters
(benchmarks/sglang_bench_serving.py, which also says how bench_serving is run).

Needs an interpreter where the sglang wheel is installed without dependencies plus what
bench_serving imports (see benchmarks/results/bench_serving_cpu.md): SPECDECODE_SGLANG_PYTHON,
else this interpreter. Skipped, with the reason, where there is none (CI does not install
sglang: the wheel and bench_serving's imports are far heavier than the test).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:      # the script imports its sibling `common`
    sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location(
    "sglang_bench_serving", ROOT / "benchmarks" / "sglang_bench_serving.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sglang_python() -> str:
    python = os.environ.get("SPECDECODE_SGLANG_PYTHON") or sys.executable
    why = bench.probe(python)
    if why is not None:
        pytest.skip(f"no interpreter runs sglang.bench_serving ({python}): {why}")
    return python


def test_bench_serving_backends_finish_every_request_with_the_exact_token_count(sglang_python,
                                                                                  tp2_server):
    a = bench.parse_args(["--sglang-python", sglang_python, "--prompts", "8", "--input-len", "24",
                          "--output-len", "16", "--concurrency", "4"])
    result = bench.run_against(sglang_python, tp2_server.url, a)
    rows = {r["backend"]: r for r in result["backends"]}
    assert set(rows) == set(bench.BACKENDS)
    for name, r in rows.items():
        assert "error" not in r, (name, r)
        assert r["completed"] == 8 and r["errors"] == 0, (name, r)
        assert r["client_output_lens"] == [16] and r["retokenized_output_lens"] == [16], (name, r)
        assert r["server_generation_tokens"] == 9 * 16 and r["server_requests"] == 9, (name, r)
    assert result["ok"]


def test_the_probe_names_what_is_missing():
    """Where sglang is absent the skip reason is the interpreter's own one-line error."""
    why = bench.probe(sys.executable)
    if why is None:
        pytest.skip("sglang.bench_serving runs in this interpreter")
    assert "sglang is not installed" in why
