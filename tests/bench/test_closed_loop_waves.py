"""benchmarks/closed_loop_waves.py: the summary of a hold (gaps, empty windows, batch share) and the
reading of the server's in-flight gauges, on recorded-shape inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import closed_loop_waves as clw  # noqa: E402


def _records(ts, bs, committed=None):
    return [{"t": t, "bs": b, "committed": b if committed is None else committed} for t, b in zip(ts, bs)]


def test_a_lockstep_wave_shows_as_a_long_gap_and_an_empty_window():
    # 64 streams at 100 iterations/s for 3 s, a 1.5-s drain gap, then a refill that starts at batch 1.
    ts = [0.01 * i for i in range(1, 301)] + [4.5 + 0.01 * i for i in range(1, 300)]
    bs = [64] * 300 + [1, 8] + [64] * 297
    m = clw.summarise(_records(ts, bs), t0=0.0, t1=7.5, c=64, settle_s=0.0)
    assert m["longest_gap_s"] == pytest.approx(1.51, abs=0.01)
    assert m["window_min"] == 0.0 and m["window_median"] == pytest.approx(6400.0)
    # Counted from the 20th iteration (the settle rule's floor): 580 of the 599.
    assert m["iterations"] == 580 and m["captures"] == 0
    assert m["below_half_batch"] == pytest.approx(2 / 580)


def test_settling_leaves_the_first_iterations_out():
    ts = [0.1 * i for i in range(1, 51)]
    m = clw.summarise(_records(ts, [4] * 50), t0=0.0, t1=5.0, c=4, settle_s=1.0)
    # The later of 1 s and 20 iterations after the start: iteration 20 ended at 2.0 s.
    assert m["iterations"] == 31 and m["tok_s"] == pytest.approx(31 * 4 / 3.0)


def test_the_server_gauges_are_read_from_metrics_text_with_or_without_labels():
    text = ("# HELP sglang:num_running_reqs The number of running requests.\n"
            'sglang:num_running_reqs{model_name="m"} 63.0\n'
            "sglang:num_queue_reqs 2\n"
            "sglang:num_running_reqs_total 5\n")
    assert dict(clw.METRIC.findall(text)) == {"num_running_reqs": "63.0", "num_queue_reqs": "2"}
