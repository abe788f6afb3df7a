"""benchmarks/schedule_ab.py: the pure parts (windows of committed tokens, settling, bootstrap and
ratios, time-weighting, the goal, the bests and whether they coincide, the plan's refusals, the
tune --schedule file) and one end-to-end run against a real server (slow)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import schedule_stats as st  # noqa: E402


def test_windows_sum_committed_tokens_and_an_empty_window_is_zero():
    ts = [0.1, 0.5, 0.9, 2.2, 2.7]
    counts = [2, 3, 1, 4, 4]
    # [0,1) has 6 tokens, [1,2) none (a stalled server made nothing), [2,3) 8; [3, 3.5) is incomplete.
    assert st.window_rates(ts, counts, 0.0, 3.5) == [6.0, 0.0, 8.0]
    # An excluded span (a capture) takes its windows out, and they restart after it.
    assert st.window_rates(ts, counts, 0.0, 3.5, exclude=[(1.0, 2.0)]) == [6.0, 8.0]


def test_a_phase_counts_from_the_later_of_the_settle_time_and_twenty_iterations():
    fast = [10.0 + 0.01 * i for i in range(1, 400)]             # 20 iterations in 0.2 s: time rules
    assert st.settled_from(10.0, fast, settle_s=2.0) == pytest.approx(12.0)
    slow = [10.0 + 0.5 * i for i in range(1, 30)]                # 20 iterations take 10 s
    assert st.settled_from(10.0, slow, settle_s=2.0) == pytest.approx(20.0)
    assert st.settled_from(10.0, slow[:5], settle_s=2.0) == math.inf
    # Records from before the switch do not count towards it.
    assert st.settled_from(10.0, [1.0] * 50 + slow, settle_s=2.0) == pytest.approx(20.0)


def test_median_interval_brackets_the_median_and_is_seeded():
    vals = [100.0, 102.0, 98.0, 101.0, 99.0, 150.0, 100.5]
    m, lo, hi = st.median_interval(vals)
    assert m == 100.5 and lo <= m <= hi and hi < 150.0
    assert st.median_interval(vals) == (m, lo, hi)
    assert all(math.isnan(x) for x in st.median_interval([]))


def test_ratio_is_num_over_den_with_an_interval_and_nan_without_data():
    r, lo, hi = st.ratio([110.0, 111.0, 109.0, 110.5, 109.5], [100.0, 101.0, 99.0, 100.5, 99.5])
    assert r == pytest.approx(1.1) and 1.0 < lo <= r <= hi
    assert all(math.isnan(x) for x in st.ratio([], [1.0]))


def test_time_weighting_uses_the_seconds_at_each_load_and_a_missing_phase_is_not_neutral():
    assert st.time_weighted({1: 1.2, 16: 0.9}, {1: 20, 16: 20}) == pytest.approx(1.05)
    assert st.time_weighted({1: 1.2, 16: 0.9}, {1: 30, 16: 10}) == pytest.approx(1.125)
    assert math.isnan(st.time_weighted({1: 1.2}, {1: 20, 16: 20}))
    assert math.isnan(st.time_weighted({1: 1.2, 16: math.nan}, {1: 20, 16: 20}))


def test_the_goal_needs_both_means_and_no_phase_wholly_below_one():
    w = {1: 20, 16: 20}
    good = {"fixed": {1: (1.10, 1.02, 1.2), 16: (1.02, 0.98, 1.06)},
            "acceptance": {1: (1.0, 0.97, 1.03), 16: (1.2, 1.1, 1.3)}}
    assert st.goal(good, w, cycles=6).passed
    assert not st.goal(good, w, cycles=3).passed and "3 cycles" in st.goal(good, w, cycles=3).why
    low_mean = {**good, "fixed": {1: (1.05, 1.01, 1.1), 16: (1.0, 0.95, 1.04)}}
    g = st.goal(low_mean, w, cycles=6)
    assert not g.passed and "schedule/best fixed time-weighted 1.025" in g.why
    # A mean that clears 1.05 still misses when one phase's whole interval is below 1.0.
    below = {**good, "acceptance": {1: (0.97, 0.95, 0.99), 16: (1.3, 1.2, 1.4)}}
    g = st.goal(below, w, cycles=6)
    assert not g.passed and "at load 1: interval wholly below 1.0" in g.why
    assert not st.goal({"fixed": {1: (math.nan,) * 3, 16: (1.2, 1.1, 1.3)}}, w, cycles=6).passed


def test_bests_per_bucket_their_coincidence_and_the_best_fixed_over_the_moving_load():
    table = {1: {0: 50.0, 3: 90.0, 7: 120.0}, 16: {0: 400.0, 3: 380.0, 7: 200.0}}
    bests = st.best_per_bucket(table)
    assert bests == {1: 7, 16: 0} and not st.bests_coincide(bests)
    # Time-weighted: steps 3 (235) beats 0 (225) and 7 (160) over equal time; more time at 16 picks 0.
    assert st.best_fixed(table, {1: 20, 16: 20}) == (3, pytest.approx(235.0))
    assert st.best_fixed(table, {1: 10, 16: 30})[0] == 0
    same = {1: {3: 90.0, 7: 120.0}, 16: {3: 300.0, 7: 310.0}}
    assert st.bests_coincide(st.best_per_bucket(same))
    assert not st.bests_coincide({1: 7})                  # one bucket: nothing to coincide with
    # A tie goes to fewer steps (cheaper); a NaN reading is no candidate.
    assert st.best_per_bucket({1: {2: 10.0, 5: 10.0, 6: math.nan}}) == {1: 2}
    with pytest.raises(st.PlanError):
        st.best_fixed({1: {3: 1.0}, 16: {5: 1.0}}, {1: 20, 16: 20})


def test_the_ceiling_is_what_each_buckets_best_gains_over_the_fixed_setting_time_weighted():
    table = {1: {0: 50.0, 3: 90.0, 7: 120.0}, 16: {0: 400.0, 3: 380.0, 7: 200.0}}
    # Fixed steps 3: load 1 could gain 120/90, load 16 400/380; equal time.
    assert st.schedule_ceiling(table, {1: 20, 16: 20}, 3) == pytest.approx((120 / 90 + 400 / 380) / 2)
    # The H200 shape: one bucket's best is the fixed setting, the other's is 8 % above it.
    h200 = {1: {3: 398.0, 4: 431.0}, 64: {3: 11153.0, 4: 10553.5}}
    ceiling = st.schedule_ceiling(h200, {1: 20, 64: 20}, 3)
    assert ceiling == pytest.approx(1.0415, abs=1e-4) and ceiling < st.GOAL_RATIO
    # The fixed setting unmeasured in a bucket: no ceiling can be read.
    assert math.isnan(st.schedule_ceiling({1: {3: 1.0}, 16: {5: 2.0}}, {1: 20, 16: 20}, 3))


def test_capture_summary_counts_keys_captured_again_as_recaptures():
    cap = lambda rows, ok=True: {"phase": "verify", "placement": "sharded", "rows": rows, "shape": [4, 256, 1],  # noqa: E731
                                 "ok": ok}
    recs = [{"t": 1.0}, {"t": 2.0, "captures": [cap(64), cap(32)]}, {"t": 3.0, "captures": [cap(64, ok=False)]}]
    assert st.capture_summary(recs) == {"captures": 3, "keys": 2, "recaptures": 1, "failed": 1}
    assert st.capture_summary([]) == {"captures": 0, "keys": 0, "recaptures": 0, "failed": 0}


def test_output_lengths_are_seeded_around_the_mean_and_spread_zero_is_the_old_script():
    import random

    import schedule_ab as sa
    spread = sa.prompts_for(0, 1000, n=64, max_new_tokens=256, spread=0.5)
    lens = [p["sampling_params"]["max_new_tokens"] for p in spread]
    assert min(lens) >= 128 and max(lens) <= 384 and len(set(lens)) > 32
    assert 200 < sum(lens) / len(lens) < 312
    assert spread == sa.prompts_for(0, 1000, n=64, max_new_tokens=256, spread=0.5)     # seeded
    fixed = sa.prompts_for(0, 1000, n=4, max_new_tokens=256)
    assert {p["sampling_params"]["max_new_tokens"] for p in fixed} == {256}
    rng = random.Random(0)          # the prompts the earlier results ran: no draw for the lengths
    assert [p["input_ids"] for p in fixed] == [[rng.randrange(1, 999) for _ in range(sa.PROMPT_LEN)] for _ in range(4)]
    assert sa.max_new_range(256, 0.5) == (128, 384)


def test_the_schedule_pins_each_bucket_from_the_geometric_middle_up():
    assert st.thresholds([1, 16]) == [1, 4]
    assert st.thresholds([1, 4, 64]) == [1, 2, 16]
    assert st.thresholds([1, 2]) == [1, 2]
    cfg = st.schedule_config({1: 7, 16: 0})
    assert cfg == {"1": {"candidate_steps": [7]}, "4": {"candidate_steps": [0]}}
    from probes import adaptive_policy
    tiers = adaptive_policy.parse_config(cfg)     # the engine's checker takes it
    assert adaptive_policy.Schedule(tiers, 7).steps_for(3) == 7
    assert adaptive_policy.Schedule(tiers, 7).steps_for(16) == 0


def test_arm_order_rotates_every_arm_once_per_round_and_is_seeded():
    order = st.arm_order(9, seed=0)
    assert len(order) == 9
    for k in range(3):
        assert sorted(order[3 * k:3 * k + 3]) == sorted(st.ARMS)
    assert st.arm_order(9, seed=0) == order and st.arm_order(9, seed=1) != order
    for bad in (0, 2, 7):
        with pytest.raises(st.PlanError, match="multiple of the 3 arms"):
            st.arm_order(bad, seed=0)


def test_the_plan_estimate_and_its_refusal_in_one_line():
    ab = st.Plan(sweep_points=0, sweep_s=4, settle_s=2, cycles=6, phase_s=(20, 20), warmup_s=3, startup_s=120)
    est = ab.estimate_s()
    # start-up + warm-up (3 arms x 2 phases x (3 s + 1 s switch)) + 6 cycles x (40 s + 2 switches)
    assert est == pytest.approx(120 + 24 + 6 * 42)
    assert st.check_plan(ab, 540) == est
    sweep_and_ab = st.Plan(sweep_points=24, sweep_s=4, settle_s=2, cycles=6, phase_s=(20, 20), warmup_s=3,
                           startup_s=120)
    with pytest.raises(st.PlanError) as e:
        st.check_plan(sweep_and_ab, 540)
    assert "\n" not in str(e.value) and "--only sweep" in str(e.value)
    assert st.check_plan(sweep_and_ab, 0) > 540                  # 0: no limit


def test_phase_seconds_and_the_poisson_script():
    assert st.phase_seconds("20") == (20.0, 20.0) and st.phase_seconds("30,10") == (30.0, 10.0)
    for bad in ("x", "0", "1,2,3", "-5", "nan"):
        with pytest.raises(st.PlanError):
            st.phase_seconds(bad)
    arr = st.poisson_arrivals(4.0, 100.0, seed=3)
    assert arr == st.poisson_arrivals(4.0, 100.0, seed=3) and arr == sorted(arr)
    assert 300 < len(arr) < 500 and all(0 <= t < 100 for t in arr)
    with pytest.raises(st.PlanError):
        st.poisson_arrivals(0.0, 10.0, seed=0)
    assert st.percentile([1, 2, 3, 4, 5], 50) == 3 and st.percentile([1, 2], 99) == pytest.approx(1.99)


def test_from_tune_reads_the_tuners_schedule_and_refuses_what_it_cannot_run():
    # tuner.tuning.schedule's JSON: a tree best pins its chain (sglang_steps); a thin bucket pins nothing.
    obj = {"buckets": [{"bucket": "1", "bs_lo": 1, "bs_hi": 1, "best": {"speculative_num_steps": 5,
                                                                     "speculative_eagle_topk": 1},
                        "sglang_steps": 5},
                       {"bucket": "2", "bs_lo": 2, "bs_hi": 7, "best": None, "sglang_steps": None,
                        "stage": "too little data"},
                       {"bucket": "8", "bs_lo": 8, "bs_hi": None, "best": {"speculative_num_steps": 3,
                                                                         "speculative_eagle_topk": 4},
                        "sglang_steps": 1}],
           "adaptive_config": {"1": {"candidate_steps": [5]}, "8": {"candidate_steps": [1]}}}
    bests, cfg = st.from_tune(obj)
    assert bests == {1: 5, 8: 1}
    assert cfg["8"]["candidate_steps"] == [1]
    # An older shape without sglang_steps: a chain best's own steps.
    assert st.from_tune({"buckets": [{"bs_lo": 1, "best": {"speculative_num_steps": 4}}],
                         "adaptive_config": {"1": {"candidate_steps": [4]}}})[0] == {1: 4}
    for bad, says in ((["x"], "expected the JSON object"), ({"buckets": []}, 'no "buckets"'),
                      ({**obj, "adaptive_config": {"x": 1}}, "adaptive_config: unknown key"),
                      ({**obj, "adaptive_config": None}, "no bucket has a chain to pin"),
                      ({"buckets": [{"bs_lo": 1, "best": None}], "adaptive_config": None}, "no bucket has a chain"),
                      ({"buckets": [{"best": {}}]}, "no bs_lo"),
                      ({"buckets": [{"bs_lo": 1, "sglang_steps": "3"}]}, "whole number")):
        with pytest.raises(st.PlanError, match=says) as e:
            st.from_tune(bad)
        assert "\n" not in str(e.value)


class _Plan:
    """The closed-loop plan summarise_closed reads: load 1 <-> 16, 20 s each."""
    open_loop, concurrency, phase_s = None, 16, (20.0, 20.0)


def _phase(load, tok_s, steps):
    """One load phase: 15 settled windows around tok_s, all at `steps`."""
    return {"load": load, "windows": [tok_s + d for d in (-2.0, -1.0, 0.0, 1.0, 2.0)] * 3,
            "steps_ran": {str(steps): 100}}


def test_the_ab_summary_pools_each_arms_phases_and_names_ratios_between_identical_settings():
    import schedule_ab as sa

    cycles = [{"arm": "schedule", "phases": [_phase(1, 130.0, 6), _phase(16, 800.0, 2)]},
              {"arm": "fixed", "phases": [_phase(1, 100.0, 2), _phase(16, 800.0, 2)]},
              {"arm": "acceptance", "phases": [_phase(1, 110.0, 3), _phase(16, 700.0, 3)]}] * 2
    res = sa.summarise_closed(cycles, _Plan())
    assert res["arms"]["schedule"]["1"]["windows"] == 30
    assert res["ratios"]["fixed"]["1"][0] == pytest.approx(1.3)
    assert res["ratios"]["fixed"]["16"][0] == pytest.approx(1.0)
    assert res["time_weighted"]["fixed"] == pytest.approx(1.15)
    # At load 16 the schedule and the fixed arm ran the same steps: that ratio is noise, and it says so.
    assert res["same_steps_loads"] == {"fixed": ["16"], "acceptance": []}
    assert res["time_weighted_same_steps_as_one"] == {"fixed": pytest.approx(1.15), "acceptance": pytest.approx(
        res["time_weighted"]["acceptance"])}
    assert res["goal"]["passed"], res["goal"]["why"]          # 1.15 and 1.16 over 6 cycles
    res = sa.summarise_closed(cycles[:3], _Plan())
    assert not res["goal"]["passed"] and "3 cycles < the 6" in res["goal"]["why"]


def test_noise_between_identical_settings_does_not_pass_the_goal():
    """The CPU run 3 shape: the schedule gains 9 % at load 1, and at load 16 every arm ran steps 3,
    where the host's noise read 1.06 and 1.21. Measured means pass 1.05; read as 1.0 they do not."""
    import schedule_ab as sa

    cycles = [{"arm": "schedule", "phases": [_phase(1, 109.0, 5), _phase(16, 770.0, 3)]},
              {"arm": "fixed", "phases": [_phase(1, 100.0, 3), _phase(16, 727.0, 3)]},
              {"arm": "acceptance", "phases": [_phase(1, 100.0, 3), _phase(16, 636.0, 3)]}] * 2
    res = sa.summarise_closed(cycles, _Plan())
    assert res["time_weighted"]["fixed"] > 1.05 and res["time_weighted"]["acceptance"] > 1.05
    assert res["same_steps_loads"] == {"fixed": ["16"], "acceptance": ["16"]}
    assert res["time_weighted_same_steps_as_one"]["fixed"] == pytest.approx(1.045)
    assert not res["goal"]["passed"]
    assert "schedule/best fixed time-weighted 1.045 < 1.05" in res["goal"]["why"]


def test_intervals_resample_cycles_so_a_same_steps_phase_is_not_called_a_loss():
    """CPU run 4 (committed JSON): at load 16 every arm ran steps 3, and the arms' cycles overlapped
    (fixed 263.5 / 211.5 / 237.5, schedule 216.0 / 204.0 / 246.0). Resampling windows as independent
    readings put schedule/acceptance-only there at hi 0.988, "wholly below 1.0"; by cycle it is not.
    The verdict stays MISS, on the means."""
    import schedule_ab as sa

    run = json.loads((ROOT / "benchmarks" / "results" / "schedule_ab_cpu.json").read_text())[
        "schedule_ab_cpu_llama_small_ab"]
    assert run["ab"]["ratios"]["acceptance"]["16"][2] < 1.0          # what the window-level bootstrap said

    class Plan(_Plan):
        concurrency = run["concurrency"]

    res = sa.summarise_closed(run["ab"]["cycles"], Plan())
    for other in ("fixed", "acceptance"):
        assert res["ratios"][other]["16"][2] > 1.0, res["ratios"]
        assert res["ratios"][other]["16"][0] == pytest.approx(run["ab"]["ratios"][other]["16"][0])
    assert not res["goal"]["passed"] and "wholly below" not in res["goal"]["why"]
    assert "time-weighted 0.981 < 1.05" in res["goal"]["why"]
    # An arm's tok/s interval spans its cycles' spread, not just its windows'.
    lo, hi = res["arms"]["fixed"]["16"]["tok_s"][1:]
    assert hi - lo > 40


def _script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "schedule_ab.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_bad_plans_are_refused_in_one_line_before_any_server_starts(tmp_path):
    cases = [(["--cycles", "4"], "multiple of the 3 arms"),
             (["--only", "ab"], "--only ab needs --table"),
             (["--phase-s", "0"], "--phase-s"),
             (["--device", "cuda", "--cycles", "6"], "over --max-wall-s 540"),
             (["--only", "ab", "--table", str(tmp_path / "none.json")], "--table"),
             (["--from-tune", str(tmp_path / "bad.json"), "--fixed", "3"], "not JSON")]
    (tmp_path / "bad.json").write_text("{nope")
    for args, says in cases:
        r = _script(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert says in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stdout == ""


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(_has_cuda(), reason="the failure needs a host without a GPU")
def test_a_server_that_cannot_start_is_one_line_not_a_traceback():
    r = _script("--device", "cuda", "--only", "sweep", "--steps", "1", timeout=120)   # no GPU here
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("schedule_ab: the server did not start") and r.stderr.count("\n") == 1


@pytest.mark.slow
def test_one_short_run_end_to_end_on_a_real_server(tmp_path):
    out = tmp_path / "ab.json"
    r = _script("--concurrency", "2", "--steps", "1,3", "--sweep-s", "1", "--phase-s", "4",
                "--cycles", "3", "--warmup-s", "0.5", "--settle-s", "0.5", "--max-new-tokens", "24",
                "--json", str(out), timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "each bucket's best" in r.stdout and ("PASS" in r.stdout or "MISS" in r.stdout)
    rep = json.loads(out.read_text())
    assert set(rep["sweep"]["bests"]) == {"1", "2"}
    assert sorted(rep["ab"]["order"]) == sorted(["schedule", "fixed", "acceptance"])
    # What ran is recorded per arm and phase: the fixed arm ran only its steps.
    fixed = str(rep["ab"]["fixed_steps"])
    assert all(set(rep["ab"]["arms"]["fixed"][ld]["steps_ran"]) <= {fixed} for ld in ("1", "2"))
    assert any(rep["ab"]["arms"][arm][ld]["steps_ran"] for arm in rep["ab"]["arms"] for ld in ("1", "2"))
    assert rep["ab"]["goal"]["passed"] is False            # 3 cycles: never a pass
