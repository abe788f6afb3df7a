"""resolve_config: one resulting configuration validated as a whole (pure logic)."""

from __future__ import annotations

import pytest

from refengine.config import ConfigError, ModelLimits, SpecConfig, parse_latency, resolve_config

LIM2 = ModelLimits(tp_size=2, draft_heads=4, draft_kv_heads=2)
BASE = SpecConfig(steps=3, topk=1, num_draft_tokens=4, placement="sharded", epoch=5)


def test_chain_derives_draft_tokens_and_bumps_epoch():
    c = resolve_config(BASE, {"speculative_num_steps": 5}, LIM2)
    assert (c.steps, c.num_draft_tokens, c.epoch) == (5, 6, 6)


def test_no_change_keeps_epoch():
    assert resolve_config(BASE, {"speculative_num_steps": 3}, LIM2) is BASE


def test_tree_bound():
    c = resolve_config(BASE, {"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 16}, LIM2)
    assert (c.topk, c.num_draft_tokens) == (4, 16)
    with pytest.raises(ConfigError, match="N - 1 <= topk"):
        resolve_config(BASE, {"speculative_num_steps": 1, "speculative_eagle_topk": 2,
                              "speculative_num_draft_tokens": 4}, LIM2)


def test_steps_zero_and_back():
    off = resolve_config(BASE, {"speculative_num_steps": 0}, LIM2)
    assert (off.steps, off.num_draft_tokens) == (0, 1)
    on = resolve_config(off, {"speculative_num_steps": 2}, LIM2)
    assert (on.steps, on.num_draft_tokens, on.epoch) == (2, 3, off.epoch + 1)


def test_sharded_needs_divisible_heads():
    lim = ModelLimits(tp_size=4, draft_heads=6, draft_kv_heads=2)
    with pytest.raises(ConfigError, match="divisible by tp_size 4"):
        resolve_config(SpecConfig(placement="replicated"), {"speculative_draft_placement": "sharded"}, lim)
    assert resolve_config(SpecConfig(placement="sharded"), {"speculative_draft_placement": "rank0"}, lim).placement == "rank0"


def test_no_draft_means_no_speculation():
    with pytest.raises(ConfigError, match="--speculative-algorithm NONE.*cannot be turned on live"):
        resolve_config(SpecConfig(steps=0), {"speculative_num_steps": 2}, ModelLimits(has_draft=False))
    # TP 2 without a draft (NONE): the draft-sharding rule has nothing to apply to.
    no_draft = ModelLimits(tp_size=2, has_draft=False)
    assert resolve_config(SpecConfig(steps=0, num_draft_tokens=1, epoch=0), {"speculative_num_steps": 0},
                          no_draft).steps == 0


def test_emulated_latency_parse():
    assert parse_latency("50") == (50.0, 0.0)
    assert parse_latency("50,2.5") == (50.0, 2.5)
    assert parse_latency(None) is None
    for bad in ("x", "1,2,3", "-1"):
        with pytest.raises(ConfigError, match="A_us"):
            parse_latency(bad)
