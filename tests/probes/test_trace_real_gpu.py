"""The analyser on a real GPU capture: both rank files of one `/start_profile` capture of the
reference engine on two H200s (NCCL over NVLink, CUDA graphs, the 8B-shaped preset, batch 4,
steps 3, replicated draft), as `specdecode-tune record --capture-trace-every` took them.

Kernels reach their phase through cudaGraphLaunch correlations; the target's all-reduces run
inside the verify graph, the replicated draft runs none. Figures asserted are structural (what
must hold for any capture of that setting) or read off this file once, never timing goals."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.trace_analysis import analyze_paths

FILES = sorted((Path(__file__).parent / "fixtures" / "refengine_h200x2").glob("*.trace.json.gz"))


@pytest.fixture(scope="module")
def analysis() -> dict:
    assert len(FILES) == 2
    return analyze_paths(FILES).to_dict()


def test_gpu_mode_with_every_iteration_on_both_ranks(analysis):
    assert analysis["mode"] == "gpu"
    assert [r["rank"] for r in analysis["ranks"]] == [0, 1]
    for r in analysis["ranks"]:
        assert r["mode"] == "gpu" and len(r["iterations"]) == 5
        # Almost every kernel lands in a phase (the rest: the profiler's own start/stop work).
        assert r["unattributed_ms"] < 0.01 * r["total"]["busy_ms"]
    assert analysis["across"]["aligned_iterations"] == 5


def test_in_graph_allreduces_are_verify_collectives_and_the_replicated_draft_has_none(analysis):
    for r in analysis["ranks"]:
        ph = r["mean"]["phases"]
        # 2 all-reduces per layer x 32 layers + embedding and lm_head: about a millisecond or more.
        assert 0.5 < ph["verify"]["comm_ms"] < ph["verify"]["ms"]
        assert ph["draft"]["comm_ms"] == 0.0 and ph["draft"]["ms"] > 0
        assert ph["draft_extend"]["comm_ms"] == 0.0 and ph["draft_extend"]["ms"] > 0
        assert ph["verify"]["ms"] > 5 * ph["draft"]["ms"], "an 8B verify dwarfs a one-layer draft"


def test_ranks_agree_on_compute_and_differ_in_waiting(analysis):
    """Same work on both ranks: compute (phase minus collectives) nearly equal; what differs is
    time inside the collectives, i.e. one rank waiting for the other."""
    a, b = (r["mean"]["phases"]["verify"] for r in analysis["ranks"])
    assert abs((a["ms"] - a["comm_ms"]) - (b["ms"] - b["comm_ms"])) < 0.05 * a["ms"]
    assert analysis["across"]["skew_ms"] < 0.5
