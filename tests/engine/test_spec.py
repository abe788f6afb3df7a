"""The speculative core through real rank processes (gloo, float64): greedy speculative output ≡
plain greedy output for every steps/placement/TP/batch, with real acceptance; live switches keep
the output; τ ≤ steps + 1; no collectives while drafting off the TP group; invalid configs refused."""

from __future__ import annotations

import re

import pytest

from refengine.client import ConfigError

from .conftest import PROMPTS, generate

PLACEMENTS = ("sharded", "replicated", "rank0")
MAX_NEW = 24


@pytest.fixture(scope="module")
def plain(pool1):
    """Plain greedy decoding (steps = 0) at TP1: the reference every run must reproduce."""
    run = generate(pool1, config={"speculative_num_steps": 0}, max_new=MAX_NEW)
    assert all(r["steps"] == 0 for r in run.records)
    return run.tokens


def test_tp2_plain_equals_tp1_plain(pool2, plain):
    run = generate(pool2, config={"speculative_num_steps": 0}, max_new=MAX_NEW)
    assert run.tokens == plain


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_greedy_spec_equals_plain(request, tp, placement, plain):
    client = request.getfixturevalue(f"pool{tp}")
    taus = []
    for steps in range(1, 6):
        for prompts, ref in ((PROMPTS, plain), (PROMPTS[:1], plain[:1])):
            run = generate(client, prompts, MAX_NEW,
                           config={"speculative_num_steps": steps, "speculative_draft_placement": placement})
            assert run.tokens == ref, f"steps={steps} batch={len(prompts)}"
            recs = [r for r in run.records if r["steps"] == steps]
            assert recs and all(r["placement"] == placement for r in recs)
            # τ ≤ steps + 1: a cycle accepts at most `steps` drafts (plus the bonus).
            assert all(0 <= a <= steps for r in recs for a in r["accepted"])
            assert all(r["committed"] <= r["bs"] * (steps + 1) for r in recs)
            for f in run.finals:
                h = f.spec.spec_correct_drafts_histogram
                assert sum(h) == f.spec.spec_verify_ct and len(h) <= steps + 1
                assert f.spec.spec_num_correct_drafts == sum(k * n for k, n in enumerate(h))
            taus.append(run.tau())
    # The agreeing checkpoint makes acceptance real: a test that rejected everything would fail.
    assert sum(taus) / len(taus) >= 1.5, taus


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_no_collectives_while_drafting_off_the_group(pool2, placement):
    run = generate(pool2, PROMPTS[:2], 16, config={"speculative_num_steps": 3,
                                                   "speculative_draft_placement": placement})
    recs = [r for r in run.records if r["placement"] == placement and r["steps"] == 3]
    assert recs
    draft_calls = [r["comm_calls"]["draft"] + r["comm_calls"]["draft_extend"] for r in recs]
    if placement == "sharded":
        # 2 draft forwards × (embedding all-reduce, o_proj, down_proj, lm_head all-gather) + extend's 4.
        assert all(c == 12 for c in draft_calls), draft_calls
    else:
        assert all(c == 0 for c in draft_calls), draft_calls
        assert all(r["comm_ms"]["draft"] == 0.0 for r in recs)
    # verify: broadcast of the drafts + embedding + 2 per layer (8 layers) + lm_head all-gather.
    assert all(r["comm_calls"]["verify"] == 1 + 1 + 16 + 1 for r in recs)


def test_live_switches_keep_output(pool1, pool2):
    switches = [(3, {"speculative_draft_placement": "replicated"}),
                (6, {"speculative_num_steps": 5, "speculative_draft_placement": "rank0"}),
                (9, {"speculative_num_steps": 0}),
                (12, {"speculative_num_steps": 2, "speculative_draft_placement": "sharded"}),
                (15, {"speculative_num_steps": 1, "speculative_draft_placement": "replicated"})]
    # 40 tokens, so request 0 is still running at the last switch even when the draft (warm
    # through tier 0) is accepted at once.
    plain = generate(pool1, PROMPTS, 40, config={"speculative_num_steps": 0}).tokens
    run = generate(pool2, PROMPTS, 40, config={"speculative_num_steps": 3,
                                              "speculative_draft_placement": "sharded"},
                   switches=switches)
    assert run.tokens == plain
    seen = {(r["placement"], r["steps"]) for r in run.records}
    assert {("replicated", 3), ("rank0", 5), ("rank0", 0), ("sharded", 2), ("replicated", 1)} <= seen
    epochs = [r["epoch"] for r in run.records]
    assert epochs == sorted(epochs)          # a config never goes back mid-run


def test_steps_zero_is_tier_zero_and_keeps_the_draft_warm(pool2, plain):
    """Steps 0 is SGLang 0.5.23's tier 0 (eagle_worker_v2.py 1491-1505): a one-token verify plus a
    draft-extend every iteration, so turning drafting back on needs no catch-up."""
    run = generate(pool2, PROMPTS, MAX_NEW, config={"speculative_num_steps": 0,
                                                   "speculative_draft_placement": "sharded"},
                   switches=[(6, {"speculative_num_steps": 3})])
    assert run.tokens == plain
    tier0 = [r for r in run.records if r["steps"] == 0]
    after = [r for r in run.records if r["steps"] == 3]
    # The sharded draft-extend's 4 collectives (embedding, o_proj, down_proj, lm_head) every iteration.
    assert tier0 and all(r["comm_calls"]["draft_extend"] == 4 and r["comm_calls"]["draft"] == 0 for r in tier0)
    # No catch-up: the first iterations after the switch run the same draft collectives as any other.
    assert after and all(r["comm_calls"]["draft"] + r["comm_calls"]["draft_extend"] == 12 for r in after)
    assert sum(a for r in after for a in r["accepted"]) > 0   # the draft was warm
    # Tier-0 rounds are verify rounds with N = 1: they count, and propose nothing.
    for f in run.finals:
        assert f.spec.spec_correct_drafts_histogram[0] >= 1


def test_random_weights_context_sensitive_target(pool2_random):
    """A random target depends on its whole context, so a KV slip would change the output."""
    ref = generate(pool2_random, PROMPTS, 20, config={"speculative_num_steps": 0}).tokens
    assert len({t for row in ref for t in row}) > 10
    for placement in PLACEMENTS:
        for steps in (1, 4):
            run = generate(pool2_random, PROMPTS, 20, config={"speculative_num_steps": steps,
                                                             "speculative_draft_placement": placement})
            assert run.tokens == ref, (placement, steps)


@pytest.mark.parametrize("changes, message", [
    ({"speculative_num_steps": -1}, "must be >= 0"),
    ({"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 6}, "steps + 1 = 4"),
    ({"speculative_draft_placement": "gpu7"}, "must be one of"),
    ({"speculative_num_steps": "3"}, "must be an integer"),
    ({"speculative_num_steps": 2.5}, "must be an integer"),
    ({"speculative_eagle_topk": 0}, "must be >= 1"),
    ({"no_such_key": 1}, "unknown key"),
])
def test_invalid_configs_refused(pool2, changes, message):
    before = pool2.active_config()
    with pytest.raises(ConfigError, match=re.escape(message)):
        pool2.set_config(changes)
    assert pool2.active_config() == before
