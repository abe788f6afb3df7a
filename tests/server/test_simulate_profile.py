"""`serve --speculative-simulate-accept-profile FILE`: the one-line refusals, a live change the
profile cannot drive, and the round trip: record a server whose acceptance is a known simulated
curve, export its profile with `report --speculation-profile`, serve from that profile, record
again, and find the same acceptance in the second recording's counts."""

from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path

import httpx
import pytest

from harness import AGREEING_MODEL, read_only_query, start_server, wait_until
from probes import speculation_profile as SP
from refengine.server.options import OptionsError, parse_options

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "report"))
from report_helpers import Recording  # noqa: E402

from tuner.cli import main  # noqa: E402


ROUNDS = 600
"""Verify rounds per recording: enough for a profile (200) and for p_k to within ~0.08 (4 σ)."""


def _write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _chain(k: int = 3) -> dict:
    return SP.build([100, 80, 60, 40][: k + 1] + [0] * max(0, k + 1 - 4), k, chain=True)


def _refusal(argv: list[str]) -> str:
    with pytest.raises(OptionsError) as e:
        parse_options(argv)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--speculative-simulate-accept")
    return msg


def test_serve_refuses_each_unusable_profile_in_one_line(tmp_path):
    flag = "--speculative-simulate-accept-profile"
    placeholder = {**_chain(), "measured": False, "mean_accept_length": None, "validation": None}
    assert "measured: false" in _refusal([flag, str(_write(tmp_path / "a.json", placeholder))])
    rising = {**_chain(), "marginal_accept_rates": [0.3, 0.5, 0.2], "mean_accept_length": 2.0}
    assert "marginal_monotonicity" in _refusal([flag, str(_write(tmp_path / "b.json", rising))])
    off_mean = {**_chain(), "mean_accept_length": _chain()["mean_accept_length"] + 0.1}
    assert "mean_consistency" in _refusal([flag, str(_write(tmp_path / "c.json", off_mean))])
    tree = SP.build([100, 80, 60, 40], 3, chain=False)
    assert "tree" in _refusal([flag, str(_write(tmp_path / "d.json", tree)), "--speculative-num-steps", "3"])
    assert "max_supported_k 2" in _refusal([flag, str(_write(tmp_path / "e.json", _chain(2))),
                                            "--speculative-num-steps", "3"])
    assert "max_supported_k 2" in _refusal([flag, str(tmp_path / "e.json")])        # the default is 3 steps
    assert "exclude each other" in _refusal([flag, str(tmp_path / "e.json"), "--speculative-simulate-accept", "2"])
    assert "cannot read" in _refusal([flag, str(tmp_path / "missing.json")])
    ok = parse_options([flag, str(_write(tmp_path / "f.json", [_chain()]))])
    assert ok.simulate_profile["num_speculative_tokens"] == 3 and ok.simulated_accept
    assert "simulate_profile" not in ok.resolved_dict()
    # A tree profile may drive a tree.
    parse_options([flag, str(tmp_path / "d.json"), "--speculative-eagle-topk", "2",
                   "--speculative-num-draft-tokens", "6"])


def _verifies(db: Path) -> float:
    row = read_only_query(db, "SELECT SUM(s.value) FROM samples s JOIN series n ON n.id = s.series_id "
                              "WHERE n.name = 'spec/verifies'")
    return float(row[0] or 0.0)


def _record_profile(url: str, tmp_path: Path, name: str, rounds: int) -> dict:
    """Record `url` under load until the file holds `rounds` verify rounds; export its profile."""
    db = tmp_path / f"{name}.db"
    rec = Recording(url, db, "--load", "8", "--max-new-tokens", "64", "--nvml-hz", "0")
    try:
        rec.wait_started()
        wait_until(lambda: db.exists() and _verifies(db) >= rounds, 300, f"{rounds} verify rounds in {db.name}",
                   interval=0.5)
    finally:
        rec.signal(signal.SIGINT)
        rec.wait(120)
    out = tmp_path / f"{name}.json"
    assert main(["report", str(db), "--speculation-profile", str(out)]) == 0
    [profile] = json.loads(out.read_text())
    return profile


@pytest.mark.slow
def test_a_profile_round_trips_through_record_report_and_serve(tmp_path):
    curve = (0.8, 0.6, 0.5)
    # Eight in flight: more verify rounds per (slow, shared-CPU) iteration. The agreeing model accepts
    # nearly everything by itself, so a simulator that ignored the curve or the profile shows.
    base = [*AGREEING_MODEL, "--port", "0", "--max-running-requests", "8", "--speculative-num-steps", "3"]
    a = start_server([*base, "--speculative-simulate-accept", ",".join(map(str, curve))])
    try:
        first = _record_profile(a.url, tmp_path, "simulated", ROUNDS)
    finally:
        a.stop(timeout=60.0)
    n1 = first["measurement_conditions"]["verify_rounds"]
    want = [curve[0], curve[0] * curve[1], curve[0] * curve[1] * curve[2]]
    # Sampling error of a proportion over n rounds is at most 0.5 / sqrt(n); 4 of them is far outside chance.
    tol1 = 4 * 0.5 / math.sqrt(n1)
    assert all(abs(p - w) <= tol1 for p, w in zip(first["marginal_accept_rates"], want)), (first, want)
    assert first["validation"]["mean_consistency"]["passed"] and first["per_category"]

    b = start_server([*base, "--speculative-simulate-accept-profile", str(tmp_path / "simulated.json")])
    try:
        info = httpx.get(f"{b.url}/server_info", timeout=30).json()
        assert info["internal_states"][0]["simulated_accept"] is True
        # A live change the profile cannot drive is refused before it reaches the ranks.
        r = httpx.post(f"{b.url}/set_internal_state", json={"server_args": {"speculative_num_steps": 4}}, timeout=60)
        assert r.status_code == 400 and "max_supported_k 3" in r.json()["error"]["message"]
        second = _record_profile(b.url, tmp_path, "replayed", ROUNDS)
    finally:
        b.stop(timeout=60.0)
    n2 = second["measurement_conditions"]["verify_rounds"]
    tol = 4 * 0.5 * math.sqrt(1 / n1 + 1 / n2)
    assert all(abs(p - q) <= tol for p, q in zip(second["marginal_accept_rates"], first["marginal_accept_rates"])), \
        (first["marginal_accept_rates"], second["marginal_accept_rates"])
    assert abs(second["mean_accept_length"] - first["mean_accept_length"]) <= 3 * tol
    assert second["measurement_conditions"]["simulated_acceptance"] is True
