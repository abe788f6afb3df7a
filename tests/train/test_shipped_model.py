"""The shipped tiny model: inside the size cap, loads with the engine's loader, and its EAGLE-3 head
reaches the published τ floor in the engine's real speculative loop on held-out prompts.

A broken loader, wrong aux layers or a mis-mapped d2t would drop τ towards 1; this is not a timing.
"""

from __future__ import annotations

import json
import threading

import pytest

from refengine.data import TINY_DIR, TINY_DRAFT_DIR, TINY_PROMPTS, TINY_TARGET_DIR
from refengine.train.corpus import read_prompts

# docs/engine.md "The tiny model": τ at 3 chain steps, greedy, measured 3.3–3.4 on held-out prompts.
TAU_FLOOR_STEPS3 = 2.5
SIZE_CAP = 25 * 1024 * 1024


def test_weights_inside_the_size_cap():
    size = sum(p.stat().st_size for p in TINY_DIR.glob("*/model.safetensors"))
    assert 0 < size <= SIZE_CAP


def test_shipped_checkpoints_load_and_agree_on_shapes():
    from refengine.loader import load_eagle3, load_llama

    target = load_llama(TINY_TARGET_DIR)
    head = load_eagle3(TINY_DRAFT_DIR)
    tcfg = json.loads((TINY_TARGET_DIR / "config.json").read_text())
    assert tcfg["num_hidden_layers"] >= 8 and target.aux_layer_ids == (1, 3, 4)
    assert head.config.aux_layer_ids == target.aux_layer_ids
    used = head.to_target_ids(__import__("torch").arange(head.config.draft_vocab_size))
    assert (used[1:] > used[:-1]).all() and head.t2d[used].all()
    assert int(head.t2d.sum()) == head.config.draft_vocab_size


@pytest.mark.slow
def test_shipped_model_reaches_the_tau_floor_in_the_engine():
    from refengine.client import EngineClient, EngineOptions, GenRequest

    prompts = [list(r["prompt"].encode()) for r in read_prompts(TINY_PROMPTS)[:4]]
    opts = EngineOptions(model_path=str(TINY_TARGET_DIR),
                         speculative_draft_model_path=str(TINY_DRAFT_DIR), load_format="auto",
                         tp_size=1, dtype="float32", speculative_num_steps=3,
                         max_running_requests=4, context_length=256, threads_per_rank=1,
                         init_timeout_s=120)
    finals = [None] * len(prompts)
    cond = threading.Condition()

    def cb_for(i):
        def cb(u):
            with cond:
                if u.finished:
                    finals[i] = u
                cond.notify_all()
        return cb

    with EngineClient.start(opts) as client:
        for i, p in enumerate(prompts):
            client.submit(GenRequest(f"floor-{i}", p, max_new_tokens=64, ignore_eos=True),
                          cb_for(i))
        with cond:
            assert cond.wait_for(lambda: all(f is not None for f in finals), timeout=300)
    verifies = sum(f.spec.spec_verify_ct for f in finals)
    correct = sum(f.spec.spec_num_correct_drafts for f in finals)
    tau = (correct + verifies) / verifies
    assert tau >= TAU_FLOOR_STEPS3, f"τ at 3 steps is {tau:.2f}, floor {TAU_FLOOR_STEPS3}"
