"""SGLang's acceptance-only policy re-implemented, and the SGLang export formats."""

import json

import pytest

from tuner.tuning.acceptance import acceptance_from_p
from probes.adaptive_policy import DEFAULT_TIERS, AdaptiveSlot, acceptance_only_pick, tier_for
from tuner.tuning.export import adaptive_config, adaptive_config_text, adaptive_flags, sglang_flags
from tuner.tuning.settings import Setting


def test_tier_routing():
    assert tier_for(1, DEFAULT_TIERS) == 1
    assert tier_for(7, DEFAULT_TIERS) == 1
    assert tier_for(8, DEFAULT_TIERS) == 8
    assert tier_for(100, DEFAULT_TIERS) == 64


def test_perfect_acceptance_climbs_to_the_top_candidate():
    acc = acceptance_from_p([1.0] * 7)
    assert acceptance_only_pick(acc, 1) == 7
    assert acceptance_only_pick(acc, 8) == 3
    assert acceptance_only_pick(acc, 64) == 0


def test_no_acceptance_falls_to_the_bottom():
    acc = acceptance_from_p([0.0] * 7)
    assert acceptance_only_pick(acc, 1) == 1
    # With 0 in the tier it oscillates between off and probing 1; off is held at least as often.
    assert acceptance_only_pick(acc, 8) in (0, 1)


def test_policy_ignores_cost_and_the_cost_model_does_not():
    from tests.tuning.synth import Stream, Truth
    from tuner.tuning.cost_model import best, fit_from_records
    from tuner.tuning.settings import settings_space

    p = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
    picks = {}
    for step_ms in (0.2, 6.0):          # a fast link and a slow one
        truth = Truth(step=step_ms, p=p)
        stream = Stream(truth)
        recs = [r for s in (Setting(0), Setting(1), Setting(3), Setting(7))
                for r in stream.records(s, 300)]
        model = fit_from_records(recs, warmup_iters=0, warmup_s=0)
        picks[step_ms] = (best(model.predict_all(settings_space(7), 1)).setting.steps,
                          acceptance_only_pick(model.acceptance, 1))
    # Acceptance alone picks the same step whatever a step costs ...
    assert picks[0.2][1] == picks[6.0][1] and picks[0.2][1] >= 5
    # ... the cost model goes deep on the fast link and shallow on the slow one.
    assert picks[0.2][0] >= 5 and picks[6.0][0] <= 2


def test_slot_follows_sglang_rules():
    slot = AdaptiveSlot([1, 3, 5, 7], 3)
    assert slot.ema == 2.0
    for _ in range(10):
        assert slot.update([3, 3]) is False     # warm-up
    changed = [slot.update([3, 3]) for _ in range(5)]
    assert changed == [False] * 4 + [True] and slot.current_steps == 5
    slot2 = AdaptiveSlot([1, 3, 5, 7], 99)
    assert slot2.current_steps == 5               # not a candidate: the middle one


def test_flags_and_adaptive_config():
    assert sglang_flags(Setting(0)) == []
    assert sglang_flags(Setting(3, 4, 8)) == [
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]
    per_bs = {2: Setting(4), 8: Setting(2), 32: Setting(0)}
    cfg = adaptive_config(per_bs)
    assert cfg == {"1": {"candidate_steps": [4]}, "8": {"candidate_steps": [2]},
                   "32": {"candidate_steps": [0]}}
    assert json.loads(adaptive_config_text(per_bs)) == cfg
    flags = adaptive_flags(per_bs, "tuned.json")
    assert flags[flags.index("--speculative-num-steps") + 1] == "4"
    assert flags[-2:] == ["--speculative-adaptive-config", "tuned.json"]
    with pytest.raises(ValueError, match="tree"):
        adaptive_config({1: Setting(3, 4, 8)})
