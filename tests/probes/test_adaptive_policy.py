"""The shared adaptive policy's pure logic: config parsing, tier routing, pins and the Schedule the
engine consults (the server-level behaviour is tests/server/test_adaptive.py)."""

from __future__ import annotations

import pytest

from probes.adaptive_policy import (KNOB_DEFAULTS, AdaptiveConfigError, Schedule, check_pin, config_json,
                                    default_config, initial_steps, parse_config)


def test_top_level_knobs_reach_every_tier_and_a_tier_value_wins():
    tiers = parse_config({"ema_alpha": 0.5, "1": {"candidate_steps": [5, 1, 3, 3]},
                          "8": {"candidate_steps": [0, 1], "ema_alpha": 0.1}})
    assert tiers[1]["candidate_steps"] == [1, 3, 5] and tiers[1]["ema_alpha"] == 0.5
    assert tiers[8]["ema_alpha"] == 0.1 and tiers[8]["warmup_batches"] == KNOB_DEFAULTS["warmup_batches"]
    assert parse_config(config_json(tiers)) == tiers        # what a server reports loads back


def test_default_config_is_sglangs():
    tiers = default_config()
    assert {bs: t["candidate_steps"] for bs, t in tiers.items()} == {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1],
                                                                    64: [0]}
    assert tiers[1]["down_hysteresis"] == -0.25 and tiers[8]["down_hysteresis"] == 0.0
    assert initial_steps(tiers, None) == 5 and initial_steps(tiers, 3) == 3
    with pytest.raises(AdaptiveConfigError, match=r"one of the adaptive candidate steps \[0, 1, 3, 5, 7\]"):
        initial_steps(tiers, 2)


@pytest.mark.parametrize("raw, words", [
    ([], "JSON object"), ({}, "no batch-size thresholds"), ({"x": {}}, "unknown key 'x'"),
    ({"-1": {"candidate_steps": [1]}}, ">= 1"), ({"1": [1]}, "candidate_steps"),
    ({"1": {"candidate_steps": [True]}}, "candidate_steps"), ({"1": {}}, "candidate_steps is missing"),
    ({"update_interval": 0, "1": {"candidate_steps": [1]}}, "update_interval"),
    ({"1": {"candidate_steps": [1], "ceiling_coeff": 0.5}}, "ceiling_coeff"),
    ({"1": {"candidate_steps": [1], "down_hysteresis": float("nan")}}, "down_hysteresis"),
])
def test_bad_configs_say_which_key(raw, words):
    with pytest.raises(AdaptiveConfigError) as e:
        parse_config(raw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_schedule_routes_by_batch_size_and_each_tier_keeps_its_own_state():
    tiers = parse_config({"warmup_batches": 0, "update_interval": 1, "1": {"candidate_steps": [1, 3]},
                          "4": {"candidate_steps": [0, 1]}})
    s = Schedule(tiers, 3)
    assert [s.steps_for(bs) for bs in (1, 3, 4, 9)] == [3, 3, 1, 1]
    # The bs >= 4 tier sees nothing accepted: it turns drafting off, then (steps 0 always probes
    # upwards, as in SGLang) tries 1 again at its next update; the bs < 4 tier is untouched.
    assert s.feed(5, [0, 0, 0, 0, 0]) is True and s.steps_for(4) == 0 and s.steps_for(1) == 3
    assert s.feed(4, [0, 0, 0, 0]) is True and s.steps_for(4) == 1 and s.steps_for(1) == 3
    assert s.slots[1].batches == 0 and s.slots[4].batches == 2


def test_a_pin_holds_every_tier_and_freezes_the_policy():
    tiers = parse_config({"warmup_batches": 0, "update_interval": 1, "1": {"candidate_steps": [1, 3]},
                          "4": {"candidate_steps": [1]}})
    assert check_pin(1, tiers) == 1 and check_pin(-1, tiers) is None
    with pytest.raises(AdaptiveConfigError, match="batch sizes >= 4"):
        check_pin(3, tiers)
    with pytest.raises(AdaptiveConfigError, match=">= 0"):
        check_pin(-2, tiers)
    s = Schedule(tiers, 3, pinned=1)
    assert s.steps_for(1) == 1
    before = (s.slots[1].ema, s.slots[1].batches)
    assert s.feed(1, [0]) is False and (s.slots[1].ema, s.slots[1].batches) == before
    s.pinned = None
    assert s.steps_for(1) == 3                      # the policy resumes where it was
