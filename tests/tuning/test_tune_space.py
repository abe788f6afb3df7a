"""One search-space rule for the TUI's tune key and the `tune` command (tuning.settings.tune_space).

Before, the app and the command each built the space: the app always added chains and offered trees
only when topk changes live; the command took `--topk` as given. The rule now: chains and tier 0
always, trees only where topk and the draft-token count both change live, placements the server
can set live (sharded always).
"""

from __future__ import annotations

from probes.names import DRAFT_TOKENS, STEPS, TOPK
from tuner.tuning.settings import tune_space


def points(space):
    return {(s.steps, s.topk, s.num_draft_tokens, s.placement) for s in space}


def test_steps_only_server_gets_chains_and_tier_0_on_sharded():
    space = points(tune_space(lambda a: a == STEPS, 2, topks=(1, 4), draft_tokens=(8,)))
    assert space == {(0, 1, 1, "sharded"), (1, 1, 2, "sharded"), (2, 1, 3, "sharded")}


def test_trees_need_topk_and_draft_tokens_live_and_chains_stay():
    both = points(tune_space(lambda a: True, 2, topks=(4,), draft_tokens=(8,), placements=("sharded",)))
    assert (2, 4, 8, "sharded") in both and (2, 1, 3, "sharded") in both
    no_n = points(tune_space(lambda a: a != DRAFT_TOKENS, 2, topks=(4,), draft_tokens=(8,), placements=("sharded",)))
    assert all(k == 1 for _, k, _, _ in no_n)


def test_placements_follow_what_the_server_can_set():
    live = {p for *_, p in points(tune_space(lambda a: True, 1))}
    assert live == {"sharded", "replicated", "rank0"}
    fixed = {p for *_, p in points(tune_space(lambda a: a in (STEPS, TOPK), 1, placements=("rank0", "sharded")))}
    assert fixed == {"sharded"}


def test_tp1_offers_no_placement():
    """At TP size 1 every placement is the same computation: the `p` key (through why_not) and the
    tuner's space leave it alone, so nothing recommends a placement SGLang has no flag for."""
    from probes.names import PLACEMENT, SHARDED
    from tuner.backends.base import TP1_PLACEMENT
    from tests.tuning.sim import SimBackend
    from tuner.tuning.settings import tune_space

    class TP1(SimBackend):
        @property
        def info(self) -> dict:
            return {"tp_size": 1}

    engine = type("Engine", (), {"t": 0.0})()      # why_not reads capabilities and info only
    tp1, tp2 = TP1(engine), SimBackend(engine)
    assert tp1.why_not(PLACEMENT) == TP1_PLACEMENT and tp2.why_not(PLACEMENT) is None
    assert tp1.why_not("speculative_num_steps") is None
    one = tune_space(lambda a: tp1.why_not(a) is None, 3)
    two = tune_space(lambda a: tp2.why_not(a) is None, 3)
    assert {s.placement for s in one} == {SHARDED}
    assert len({s.placement for s in two}) > 1
