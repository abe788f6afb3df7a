"""benchmarks/attend_sweep.py: every launch override of the attention kernel computes the same
attention as plan()'s launch (Triton's interpreter on CPU tensors), and bad shapes are refused."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attend_sweep as sw  # noqa: E402


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_every_override_matches_plans_launch_under_the_interpreter(tmp_path):
    out = tmp_path / "sweep.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attend_sweep.py"), "--device", "cpu",
                        "--shapes", "2x1x40:20,1x4x70", "--block-n", "16,32", "--splits", "1,3", "--warps", "4",
                        "--json", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(x["b"], x["t"], x["c"], x["length"]) for x in rows] == [(2, 1, 40, 20), (1, 4, 70, 70)]
    for row in rows:
        # 2 blocks x 2 splits x 1 warp count x reading or skipping hidden columns
        assert len(row["configs"]) == 8 and all("error" not in c for c in row["configs"])
        assert {c["skip_hidden"] for c in row["configs"]} == {False, True}
        # float32 under the interpreter: only the summation order differs between launches.
        assert max(c["max_abs_diff"] for c in row["configs"]) < 1e-5
        assert row["best"]["us"] == min(c["us"] for c in row["configs"])
    assert "flagged" not in r.stdout


def test_shapes_are_three_positive_numbers_and_an_optional_length_within_them():
    assert sw._shapes("64x1x322,1x4x472:320") == [(64, 1, 322, 322), (1, 4, 472, 320)]
    for bad in ("64x1", "64x0x3", "axbxc", "", "2x4x40:3", "2x1x40:41", "2x1x40:"):
        with pytest.raises(argparse.ArgumentTypeError):
            sw._shapes(bad)
