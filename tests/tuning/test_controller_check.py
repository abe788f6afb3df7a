"""The adaptive controller checked (tuner.tuning.controller_check), from synthetic records with known
costs: the tier it ran per batch bucket, the tuner's best there and the predicted tok/s lost."""

from __future__ import annotations

import json

import pytest

from tests.tuning.synth import Stream, Truth
from tuner.tuning import controller_check as cc
from tuner.tuning.observations import parse_record, settle
from tuner.tuning.settings import Setting

LOW = Truth(step=0.3)                                   # batch 1: deep chains win
HIGH = Truth(verify_n=2.5, off_verify=9.0, step=1.5)    # batch 8: shallow chains win


def _records(parts, seed: int = 3) -> list:
    stream = Stream(LOW, seed=seed)
    out = []
    for truth, steps, n, bs, adaptive in parts:
        stream.truth = truth
        recs = stream.records(Setting(steps) if steps else Setting(0), n, bs=bs)
        for r in recs:
            r["adaptive"] = adaptive
        out += recs
    return settle([parse_record(r) for r in out], warmup_iters=20, warmup_s=0.0)


def test_the_controller_running_deep_chains_at_high_batch_costs_predicted_tok_s() -> None:
    probes = [(HIGH, s, 80, 8, False) for s in (1, 2, 3, 5)] + [(LOW, s, 80, 1, False) for s in (1, 3, 5)]
    ran = [(HIGH, 5, 200, 8, True), (LOW, 3, 200, 1, True), (LOW, 5, 30, 1, True)]
    doc = cc.check_from_iterations(_records(probes + ran))
    assert doc is not None and doc["source"] == "records" and not doc["approximate"]
    rows = {r["bucket"]: r for r in json.loads(json.dumps(doc))["rows"]}
    high = rows["8"]
    assert high["chosen_steps"] == 5 and high["chosen_share"] == 1.0
    assert high["best_steps"] in (1, 2)
    # The predicted loss is the truth's difference, within the fit's noise.
    truth_loss = HIGH.tok_s(Setting(high["best_steps"]), 8) - HIGH.tok_s(Setting(5), 8)
    assert high["loss_tok_s"] == pytest.approx(truth_loss, rel=0.15)
    assert high["loss_pct"] > 10
    low = rows["1"]
    assert low["chosen_steps"] == 3 and low["tiers"] == {"3": 180, "5": 10}
    assert low["loss_pct"] < 3                       # the controller is (about) right at batch 1
    text = cc.lines(doc)
    assert any(line.startswith("batch 8–15") and "ran s5 (100%)" in line and "best s" in line for line in text)
    # The whole traffic's cost: each bucket's kept share weighted by the time the controller ran there.
    iters = _records(probes + ran)
    wall = {lo: sum(it.wall_ms for it in iters if it.adaptive and cc.bucket_lo(it.bs) == lo) for lo in (1, 8)}
    kept = {lo: rows[str(lo)]["chosen_tok_s"] / rows[str(lo)]["best_tok_s"] for lo in (1, 8)}
    want = 100 * (1 - sum(wall[lo] * kept[lo] for lo in (1, 8)) / sum(wall.values()))
    assert doc["overall"] == {"loss_pct": pytest.approx(want, abs=1e-2), "weighted_by": "time", "buckets": 2}
    assert low["loss_pct"] < doc["overall"]["loss_pct"] < high["loss_pct"]
    assert cc.overall_text(doc) == f"−{doc['overall']['loss_pct']:.1f} % overall"
    assert "2 batch buckets weighted by time" in cc.overall_text(doc, long=True)


def test_the_overall_cost_weights_buckets_by_time_or_else_by_counts() -> None:
    def row(lo, n, chosen, best):
        return cc.CheckRow(lo, None, cc.ChosenTier(lo, 3, 1.0, n, {3: n}), Setting(1), "measured", chosen, best)

    rows = [row(1, 900, 90.0, 100.0), row(8, 100, 50.0, 100.0), row(16, 50, 120.0, 100.0),
            cc.CheckRow(32, None, cc.ChosenTier(32, 1, 1.0, 40, {1: 40}), None, cc.NO_FIT, None, None)]
    by_count = cc.overall(rows, None, cc.GAUGES)
    # 900 × 0.9 + 100 × 0.5 + 50 × 1.0 (a prediction above the best is capped at no loss); no-fit left out.
    assert by_count == {"loss_pct": pytest.approx(100 * (1 - (810 + 50 + 50) / 1050), abs=1e-3),
                        "weighted_by": "samples", "buckets": 3}
    by_time = cc.overall(rows, {1: 10.0, 8: 30.0, 16: 0.0}, cc.RECORDS)
    assert by_time == {"loss_pct": pytest.approx(100 * (1 - (9.0 + 15.0) / 40), abs=1e-3),
                       "weighted_by": "time", "buckets": 2}
    assert cc.overall(rows[3:], None, cc.LOG) is None
    assert cc.overall_text({"overall": None}) == ""
    assert cc.overall_text({"overall": {"loss_pct": 0.0, "weighted_by": "time", "buckets": 2}}) == \
        "on the tuned best overall"


def test_no_adaptive_iteration_no_check() -> None:
    assert cc.check_from_iterations(_records([(LOW, 3, 60, 1, False)])) is None


def test_without_phase_costs_the_gauges_give_an_approximate_tier() -> None:
    running = [(0.0, 1.0), (1.0, 1.0), (2.0, 9.0), (3.0, 9.0), (4.0, 0.0), (20.0, 9.0)]
    steps = [(0.5, 5.0), (1.5, 5.0), (2.5, 1.0), (3.5, 3.0), (4.5, 3.0), (12.0, 1.0), (20.5, 1.0)]
    pairs = cc.pairs_from_gauges(running, steps, max_age_s=5.0)
    # 4.5: nothing running; 12.0: the newest running reading is 8 s old.
    assert pairs == [(1, 5), (1, 5), (9, 1), (9, 3), (9, 1)]
    doc = cc.check(cc.chosen_tiers(pairs), None, cc.GAUGES)
    assert doc["approximate"] and doc["note"].startswith("Approximate")
    rows = {r["bucket"]: r for r in doc["rows"]}
    assert rows["1"]["chosen_steps"] == 5 and rows["8"]["chosen_steps"] == 1
    assert rows["8"]["chosen_share"] == pytest.approx(2 / 3, abs=1e-3)
    assert rows["8"]["best_steps"] is None and rows["8"]["stage"] == cc.NO_FIT
    assert any("ran s1 (67%)" in line and "no fit" in line for line in cc.lines(doc))
    assert doc["overall"] is None                     # no fit, no cost


def test_chosen_tiers_from_any_source_of_pairs() -> None:
    # What a parser of SGLang's log lines will hand in: (batch size, steps) per line.
    got = cc.chosen_tiers([(1, 7), (1, 7), (1, 5), (40, 1), (33, 0), (33, 0)])
    assert got[1].steps == 7 and got[1].n == 3
    assert got[32].steps == 0 and got[32].tiers == {0: 2, 1: 1}


def test_pairs_from_the_log_are_checked_against_the_fit_of_the_phase_records() -> None:
    iters = _records([(HIGH, s, 80, 8, False) for s in (1, 2, 3, 5)])
    doc = cc.check_from_pairs([(8, 5)] * 30 + [(9, 3)] * 10, cc.LOG, iters)
    assert doc["source"] == "log" and not doc["approximate"]
    (row,) = doc["rows"]
    assert row["chosen_steps"] == 5 and row["best_steps"] in (1, 2) and row["loss_tok_s"] > 0
    assert cc.check_from_pairs([], cc.LOG) is None
    alone = cc.check_from_pairs([(1, 3)], cc.LOG)
    assert alone["rows"][0]["stage"] == cc.NO_FIT


def test_a_bucket_where_only_the_tier_it_ran_is_known_has_no_best() -> None:
    # The controller sat at steps 5 at batch 8 and nothing else was measured there: the fit cannot
    # say whether another tier is better, so no "best" (it would only echo the tier it ran).
    doc = cc.check_from_iterations(_records([(HIGH, 5, 200, 8, True)]))
    (row,) = doc["rows"]
    assert row["chosen_steps"] == 5 and row["best_steps"] is None and row["stage"] == cc.ONE_TIER
    assert row["chosen_tok_s"] is not None and row["loss_tok_s"] is None
