"""The per-batch-bucket schedule (tuner.tuning.schedule) from synthetic observations with known costs:
each bucket's best, its stage, the SGLang adaptive config and the JSON shape `--from-tune` reads."""

from __future__ import annotations

import json

from tests.tuning.synth import Stream, Truth
from tuner.tuning import schedule as sch
from tuner.tuning.observations import parse_record, settle
from tuner.tuning.settings import Setting, settings_space

SPACE = settings_space(max_steps=7)
# Batch 1: drafting is cheap against the target, deep chains win. Batch 8: verify grows with
# N × batch, so shallow chains win.
LOW = Truth(step=0.3)
HIGH = Truth(verify_n=2.5, off_verify=9.0, step=1.5)


def _iters(parts: list[tuple[Truth, Setting, int, int]], seed: int = 1) -> list:
    recs = []
    stream = Stream(LOW, seed=seed)
    for truth, s, n, bs in parts:
        stream.truth = truth
        recs += stream.records(s, n, bs=bs)
    # Synthetic iterations are ~10 ms: the settle rule by iterations only.
    return settle([parse_record(r) for r in recs], warmup_iters=20, warmup_s=0.0)


def _truth_best(truth: Truth, bs: int) -> float:
    return max(truth.tok_s(s, bs) for s in SPACE)


def _measured(truth: Truth, bs: int, steps: tuple[int, ...], n: int = 80) -> list:
    return [(truth, Setting(s) if s else Setting(0), n, bs) for s in steps]


def test_each_bucket_gets_its_own_best_and_the_config_pins_it() -> None:
    iters = _iters(_measured(LOW, 1, (0, 1, 3, 5, 7)) + _measured(HIGH, 8, (0, 1, 2, 3, 5, 7)))
    s = sch.fit_schedule(iters, SPACE)
    low, high = s.row(1), s.row(8)
    assert low is not None and high is not None
    assert low.best is not None and high.best is not None
    # The fit's pick is (within noise) the truth's best at each batch size.
    assert LOW.tok_s(low.best.setting, 1) >= 0.97 * _truth_best(LOW, 1)
    assert HIGH.tok_s(high.best.setting, 8) >= 0.97 * _truth_best(HIGH, 8)
    assert low.best.setting.steps > high.best.setting.steps
    cfg = s.adaptive_config()
    assert cfg == {"1": {"candidate_steps": [low.chain.setting.steps]},
                   "8": {"candidate_steps": [high.chain.setting.steps]}}
    assert low.stage in (sch.MEASURED, sch.PREDICTED_ONLY) and high.stage in (sch.MEASURED, sch.PREDICTED_ONLY)
    assert "--speculative-adaptive" in s.flags()


def test_a_measured_best_shows_its_measured_tok_s_and_an_unmeasured_one_is_predicted_only() -> None:
    # Batch 1 measured at 1 and 7 only: its best (a middle depth) was never run.
    iters = _iters(_measured(LOW, 1, (1, 7), n=120) + _measured(HIGH, 8, (1, 2, 7), n=120))
    s = sch.fit_schedule(iters, [x for x in SPACE if x.steps > 0])
    low, high = s.row(1), s.row(8)
    assert low.best.setting.steps not in (1, 7)
    assert low.stage == sch.PREDICTED_ONLY and low.best.measured_tok_s is None
    assert high.best.setting.steps in (1, 2)
    assert high.stage == sch.MEASURED and high.best.measured_tok_s is not None
    doc = s.to_json()
    row8 = next(b for b in doc["buckets"] if b["bucket"] == "8")
    assert row8["measured_tok_s"] is not None and row8["stage"] == "measured"


def test_a_bucket_with_too_little_data_is_named_and_not_pinned() -> None:
    iters = _iters(_measured(LOW, 1, (1, 3, 7)) + _measured(HIGH, 4, (1,), n=30))
    s = sch.fit_schedule(iters, SPACE, min_iters=50, expected=[1, 2, 4, 16])
    assert [r.lo for r in s.rows] == [1, 2, 4, 16]
    assert s.row(1).stage != sch.TOO_LITTLE
    for lo in (2, 4, 16):
        assert s.row(lo).stage == sch.TOO_LITTLE and s.row(lo).best is None
    assert s.row(2).iterations == 0 and "no iteration" in s.row(2).reason
    assert "needs 50" in s.row(4).reason
    assert list(s.adaptive_config()) == ["1"]
    assert any("too little data at batch 2–3, 4–7, 16–31" in n for n in s.notes)
    lines = sch.table_lines(s.to_json())
    assert any(line.lstrip().startswith("4–7") and "too little data" in line for line in lines)


def test_the_json_has_the_shape_the_ab_script_reads() -> None:
    iters = _iters(_measured(LOW, 1, (1, 3, 7)) + _measured(HIGH, 2, (1, 3, 7)))
    doc = json.loads(json.dumps(sch.fit_schedule(iters, SPACE, loads=[1, 2]).to_json()))
    assert set(doc) == {"buckets", "adaptive_config", "flags", "loads", "notes", "versus_fixed"}
    b = doc["buckets"][0]
    assert {"bucket", "bs_lo", "bs_hi", "best", "predicted_tok_s", "measured_tok_s", "stage"} <= set(b)
    assert (b["bucket"], b["bs_lo"], b["bs_hi"]) == ("1", 1, 1)
    assert b["best"]["speculative_num_steps"] == Setting.from_json(
        {"steps": b["best"]["speculative_num_steps"]}).steps
    assert doc["loads"] == [1, 2]


def test_the_same_best_everywhere_is_said() -> None:
    iters = _iters(_measured(LOW, 1, (1, 3, 7)) + _measured(LOW, 2, (1, 3, 7)))
    s = sch.fit_schedule(iters, SPACE)
    assert any("a fixed setting does as well" in n for n in s.notes)


def _weighted_best_chain(s: sch.Schedule, weights: dict[int, float]) -> Setting:
    chains = [x for x in SPACE if x.topk == 1]
    score = {c: sum(w * s.model.predict(c, s.row(lo).bs).tok_s for lo, w in weights.items()) for c in chains}
    return max(score, key=lambda c: (score[c], -c.steps))


def test_the_schedule_against_the_one_fixed_chain_that_does_best_over_the_traffic() -> None:
    iters = _iters(_measured(LOW, 1, (0, 1, 3, 5, 7)) + _measured(HIGH, 8, (0, 1, 2, 3, 5, 7)))
    s = sch.fit_schedule(iters, SPACE)
    vs = s.vs_fixed
    assert vs is not None and set(vs.weights) == {1, 8}
    # Weights are each bucket's share of the host time its iterations took.
    wall = {lo: sum(it.wall_ms for it in iters if sch.bucket_lo(it.bs) == lo) for lo in (1, 8)}
    assert abs(vs.weights[1] - wall[1] / (wall[1] + wall[8])) < 1e-9
    assert vs.fixed == _weighted_best_chain(s, vs.weights)
    # Each bucket's pinned chain is its best, so no ratio is below 1, and the optima differ here.
    for lo in (1, 8):
        fixed_there = s.model.predict(vs.fixed, s.row(lo).bs).tok_s
        assert abs(vs.ratios[lo] - s.row(lo).chain.tok_s / fixed_there) < 1e-9
        assert vs.ratios[lo] >= 1.0 - 1e-9
    assert max(vs.ratios.values()) > 1.05
    assert abs(vs.gain - sum(vs.weights[lo] * vs.ratios[lo] for lo in (1, 8))) < 1e-9
    doc = json.loads(json.dumps(s.to_json()))
    assert doc["versus_fixed"]["fixed_steps"] == vs.fixed.steps and set(doc["versus_fixed"]["ratios"]) == {"1", "8"}
    line = next(x for x in sch.table_lines(doc) if "against one fixed setting" in x)
    assert f"steps {vs.fixed.steps}" in line and f"{vs.gain:.3f}×" in line


def test_the_fixed_chain_follows_where_the_traffic_spends_its_time() -> None:
    # The same two regimes; only the time spent at each batch size differs.
    at_1 = sch.fit_schedule(_iters(_measured(LOW, 1, (0, 1, 3, 5, 7), n=400) + _measured(HIGH, 8, (0, 1, 3, 7), n=40)),
                            SPACE).vs_fixed
    at_8 = sch.fit_schedule(_iters(_measured(LOW, 1, (0, 1, 3, 5, 7), n=40) + _measured(HIGH, 8, (0, 1, 3, 7), n=400)),
                            SPACE).vs_fixed
    assert at_1 is not None and at_8 is not None
    assert at_1.weights[1] > 0.5 > at_8.weights[1]
    assert at_1.fixed.steps > at_8.fixed.steps
    # Where the traffic mostly sits, the fixed chain is (nearly) that bucket's own best.
    assert at_1.ratios[1] < 1.02 and at_8.ratios[8] < 1.02


def test_one_bucket_has_no_comparison_and_a_small_gain_is_named() -> None:
    one = sch.fit_schedule(_iters(_measured(LOW, 1, (1, 3, 7))), SPACE)
    assert one.vs_fixed is None and one.to_json()["versus_fixed"] is None
    assert not any("against one fixed setting" in x for x in sch.table_lines(one.to_json()))
    two = sch.fit_schedule(_iters(_measured(LOW, 1, (0, 1, 3, 5, 7)) + _measured(HIGH, 8, (0, 1, 2, 3, 5, 7))), SPACE)
    assert not any("predicted within" in n for n in two.notes)        # this gain is not small
    close = sch.VersusFixed(Setting(3), {1: 0.5, 8: 0.5}, {1: 1.01, 8: 1.0}, 1.005)
    assert any("predicted within 2 % of one fixed setting, steps 3" in n for n in sch._notes(two.rows, close))


def test_a_tree_best_is_exported_as_the_best_chain() -> None:
    space = settings_space(max_steps=4, topks=(1, 4), draft_tokens=(8,))
    trees_win = Truth(step=0.3, branch=0.05, tree_gain=1.4)
    iters = _iters(_measured(trees_win, 1, (1, 2, 4))
                   + [(trees_win, Setting(3, 4, 8), 80, 1), (trees_win, Setting(2, 4, 8), 80, 1)])
    s = sch.fit_schedule(iters, space)
    row = s.row(1)
    assert row.best.setting.topk == 4
    assert row.chain is not None and row.chain.setting.topk == 1
    assert s.adaptive_config() == {"1": {"candidate_steps": [row.chain.setting.steps]}}
    assert any("not a chain" in n for n in s.notes)


def test_loads_to_sweep() -> None:
    assert sch.loads_to_sweep(16, None) == [1, 2, 4, 8, 16]
    assert sch.loads_to_sweep(48, 10) == [1, 2, 4, 8, 10]
    assert sch.loads_to_sweep(None, None) == [1]
    assert sch.loads_to_sweep(1, 8) == [1]
    assert sch.bucket_bounds(8) == (8, 15) and sch.bucket_bounds(1) == (1, 1)
    assert sch.bucket_lo(40) == 32 and sch.bucket_lo(3) == 2
