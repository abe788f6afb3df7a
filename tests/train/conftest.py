"""Shared fixtures for the tiny-model training tests: one CPU thread, small random models."""

from __future__ import annotations

import pytest
import torch

from refengine.train import configs, models


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


SMALL = configs.TinyShape(layers=8, hidden=32, heads=4, kv_heads=2, intermediate=64,
                          head_intermediate=64, draft_vocab=40)


@pytest.fixture(scope="session")
def small_models():
    """A random target and head of the tiny model's structure, with a real d2t/t2d."""
    from refengine.train.draft_vocab import draft_vocab

    torch.manual_seed(0)
    tcfg, hcfg = configs.target_config(SMALL), configs.head_config(SMALL)
    target = models.build_target(tcfg).eval()
    head = models.build_head(hcfg).eval()
    counts = torch.arange(tcfg["vocab_size"]).flip(0) % 97  # an arbitrary frequency profile
    d2t, t2d = draft_vocab(counts, SMALL.draft_vocab)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    return target, head, tcfg, hcfg
