"""benchmarks/batch_cost.py: the per-round replay figures from the engine's cumulative graph
statistics, and the floors, on recorded-shape inputs."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import batch_cost as bc  # noqa: E402


def _key(label, phase, rows, t, replays, ms):
    return {label: {"key": label, "phase": phase, "rows": rows, "shape": [t, 512, 4096],
                    "replays": replays, "replay_ms_mean": ms}}


def test_a_rounds_replays_are_the_difference_of_two_cumulative_snapshots():
    before = {**_key("v5", "verify", 64, 5, 10, 4.0), **_key("d", "draft_step", 64, 1, 40, 0.5)}
    after = {**_key("v5", "verify", 64, 5, 30, 5.0), **_key("d", "draft_step", 64, 1, 40, 0.5),
             **_key("v5-32", "verify", 32, 5, 7, 3.0), **_key("e", "draft_extend", 64, 5, 20, 1.5)}
    got = bc._replay_delta(before, after, rows=64)
    # verify: 30 replays at 5.0 ms mean after, 10 at 4.0 before -> 20 in the round at 5.5 ms.
    assert got["v5"]["replays"] == 20 and got["v5"]["ms"] == pytest.approx(5.5)
    # A key new in the round counts whole; one with no replays in the round and other batches do not.
    assert got["e"] == {"phase": "draft_extend", "shape": [5, 512, 4096], "replays": 20, "ms": 1.5}
    assert "d" not in got and "v5-32" not in got


def test_keys_without_replay_timing_are_left_out():
    after = _key("v", "verify", 64, 2, 12, None)
    assert bc._replay_delta({}, after, rows=64) == {}


def test_the_floors_are_memory_bound_at_one_token_and_compute_bound_at_many():
    a = Namespace(model_path="llama-3.1-8b", dtype="bfloat16", ctx=256, tokens=128, batch=64,
                  t=[1, 8], steps=[0, 7], peak_tflops=989.0)
    fl = bc.floors(a, bw=4.2e12)
    # 8B in bf16 streams about 15 GB of matrices, plus 64 rows of KV over 320 positions (2.7 GB).
    assert fl[1]["memory_ms"] == pytest.approx(4.2, abs=0.3)
    assert fl[1]["floor_ms"] == fl[1]["memory_ms"] > fl[1]["compute_ms"]
    # 2 * 7.5e9 params * 64 rows * 8 tokens over 989 TFLOP/s ≈ 7.8 ms: above the memory floor.
    assert fl[8]["compute_ms"] == pytest.approx(7.8, abs=0.5)
    assert fl[8]["floor_ms"] == fl[8]["compute_ms"] > fl[8]["memory_ms"]


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_a_saved_h200_report_reads_back_with_its_projection_at_the_floor():
    """The committed H200 run (engine with CUDA graphs next to the matmuls alone): the summary is
    arithmetic on recorded parts, so it is checked against them by hand."""
    import json

    report = json.loads((RESULTS / "batch_cost_h200.json").read_text())["batch_cost_h200_matmuls"]
    s = bc.summarise(report)
    steps3 = next(e for e in report["engine"] if e["steps"] == 3)
    mm4 = report["matmuls_ms"]["4"]
    assert s["engine_over_matmuls"][4] == pytest.approx(steps3["verify_gpu_ms"] / mm4)
    kv = bc._floors_of(report)[4]["kv_ms"]
    it = mm4 + kv + steps3["iteration_ms_median"] - steps3["verify_gpu_ms"]
    assert s["projected_at_floor"][3]["tok_s"] == pytest.approx(1e3 * steps3["committed_per_iteration"] / it)
    # What the run found: the engine's best at batch 64 is steps 3; with its verify at the floor, steps 2.
    assert (s["best_steps_measured"], s["best_steps_at_floor"]) == (3, 2)
    lines = bc.table_lines(report)
    assert lines[-1] == "  best chain setting at batch 64: steps 3 measured; at the floor steps 2"


def test_from_json_refuses_what_is_not_a_report_in_one_line(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"model": "llama-3.1-8b"}')
    assert bc.main(["--from-json", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"batch_cost: --from-json {bad}: not a batch_cost report") and "\n" not in err
