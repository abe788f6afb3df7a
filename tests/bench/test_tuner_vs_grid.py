"""benchmarks/tuner_vs_grid.py: how the grid's client readings scatter around the server-side busy
rate of the same measurement, and the line the report prints for it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tuner_vs_grid as tvg  # noqa: E402


def test_reading_noise_compares_each_client_reading_with_its_own_server_side_rate():
    runs = {"a": [40.0, 49.8], "b": [39.9, 20.0], "c": [10.0]}
    phase = {"a": [40.0, 44.9], "b": [43.1, 21.0], "c": [math.nan]}
    rn = tvg.reading_noise(runs, phase)
    assert rn["readings"] == 4                          # the NaN server reading is no pair
    assert rn["above_phase_by_5pct"] == 1 and rn["below_phase_by_5pct"] == 1
    assert rn["client_over_phase_median"] == pytest.approx((1.0 + 20 / 21) / 2)
    assert tvg.reading_noise({"a": [1.0]}, {"a": [1.0]}) == {"readings": 1}


def test_the_report_names_the_reading_noise_only_when_there_is_some():
    base = {"emulate_comm_latency": None, "space": 11, "repeats": 2, "grid_wall_s": 120.0, "grid_one_pass_s": 60.0,
            "grid_noise": 0.075, "threshold": 0.075,
            "grid_best": {"steps": 5, "topk": 1, "num_draft_tokens": 6, "placement": "replicated", "tok_s": 127.2},
            "tuner_best": None, "reach_fraction_of_one_pass": None, "acceptance_only": None}
    assert not any("busy rate" in line for line in tvg.report(base))
    rn = tvg.reading_noise({"a": [40.0, 49.8, 39.9]}, {"a": [40.0, 44.9, 43.1]})
    line = [x for x in tvg.report({**base, "reading_noise": rn}) if "busy rate" in x]
    assert len(line) == 1 and "1 of 3 read over 5 % above it" in line[0]


def test_head_to_head_takes_two_different_chain_settings():
    from tuner.tuning.settings import Setting

    a, b = tvg.parse_pair("4:replicated,5")
    assert a == Setting(4, 1, 5, "replicated") and b == Setting(5, 1, 6, "sharded")
    assert tvg.parse_pair("0,3:replicated")[0] == Setting(0)
    for bad in ("4:replicated", "4,4", "x,5", "4:nowhere,5"):
        with pytest.raises(SystemExit, match="--head-to-head"):
            tvg.parse_pair(bad)


def test_summarise_reads_the_committed_series_and_out_extends_it(tmp_path):
    """The quiet 2-core runs are one series file (benchmarks/folded.py): --summarise reads all six,
    and --out adds a run to a series instead of writing a file per run."""
    import folded

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    series = results / "tuner_vs_grid_cpu_2core.json"
    assert len(folded.runs(folded.read(series))) == 6
    lines = tvg.summarise([series])
    assert lines and any("slow link" in ln for ln in lines) and any("no emulated latency" in ln for ln in lines)
    out = tmp_path / "series.json"
    run = {"argv": [], "results": []}
    folded.append_run(out, run)
    folded.append_run(out, {**run, "argv": ["a"]})
    folded.append_run(out, {**run, "argv": ["b"]}, replace_last=True)   # the same run, grown
    assert [r["argv"] for r in folded.runs(folded.read(out))] == [[], ["b"]]
    with pytest.raises(folded.FoldedError, match="no run 'nope'"):
        folded.read(f"{series}#nope")
    with pytest.raises(folded.FoldedError, match="not JSON"):
        (tmp_path / "bad.json").write_text("{")
        folded.read(tmp_path / "bad.json")
