"""The graph path through real TP2 rank processes on CPU, with the static stand-in for CUDA graphs
(same static buffers, padding, keys, capture events and records; the body re-executed instead of
replayed): greedy output ≡ plain for every placement, chains and trees, with padded batches;
changing steps captures no new draft-step graph; captures are flagged in the phase records;
in-graph collectives are counted and carry no comm time; the ranks inherit the environment."""

from __future__ import annotations

import pytest

from refengine.client import EngineClient, EngineOptions

from .conftest import PROMPTS, _start, generate

PLACEMENTS = ("sharded", "replicated", "rank0")
MAX_NEW = 20


@pytest.fixture(scope="module")
def graphed():
    c = _start(2, cuda_graph="static", cuda_graph_timing=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def plain(pool1):
    return generate(pool1, config={"speculative_num_steps": 0}, max_new=MAX_NEW).tokens


def _captures(records, phase=None):
    return [c for r in records for c in r.get("captures", []) if phase is None or c["phase"] == phase]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_graphed_greedy_equals_plain(graphed, plain, placement):
    for config in ({"speculative_num_steps": 3, "speculative_eagle_topk": 1},
                   {"speculative_num_steps": 1},
                   {"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}):
        run = generate(graphed, PROMPTS, MAX_NEW, config={**config, "speculative_draft_placement": placement})
        assert run.tokens == plain, (placement, config)
        assert all(r["graph_mode"] == "static" for r in run.records)
        # Back to a chain so the next config's topk=1 derivation holds.
        graphed.set_config({"speculative_eagle_topk": 1, "speculative_num_steps": 3})
    run = generate(graphed, PROMPTS, MAX_NEW, config={"speculative_num_steps": 0})
    assert run.tokens == plain


def test_live_switches_through_steps_zero_keep_output(graphed, pool1):
    # Tier 0 (steps 0) extends the draft from the verify graph's aux every iteration, at width 1.
    # Room after the last switch: the overlap scheduler reads the iteration in flight (old setting,
    # up to 5 tokens) before a change takes effect.
    plain = generate(pool1, config={"speculative_num_steps": 0}, max_new=2 * MAX_NEW).tokens
    run = generate(graphed, PROMPTS, 2 * MAX_NEW, config={"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                                      "speculative_draft_placement": "sharded"},
                   switches=[(3, {"speculative_num_steps": 0}), (9, {"speculative_num_steps": 2,
                                                                     "speculative_draft_placement": "rank0"}),
                             (14, {"speculative_num_steps": 4, "speculative_draft_placement": "replicated"})])
    assert run.tokens == plain
    assert {r["steps"] for r in run.records} >= {0, 2, 4}


def test_steps_change_reuses_draft_graphs_and_captures_are_flagged(graphed):
    graphed.set_config({"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                        "speculative_draft_placement": "sharded"})
    # Which batch buckets a run meets depends on when the ranks see each request, so a second run
    # can still meet a new one: warm up until a run captures nothing. Keys are finite (buckets x
    # phases), so this ends unless graphs are captured again and again (the failure it catches).
    for _ in range(6):
        warm = generate(graphed, PROMPTS, MAX_NEW)
        if not _captures(warm.records):
            break
    assert _captures(warm.records) == [] and not any(r["capture"] for r in warm.records)
    # Which batch buckets a run meets depends on when the ranks see each request (a request can
    # run alone for an iteration before the others arrive), so compare with the keys held now.
    held = {(k["placement"], k["rows"], tuple(k["shape"]))
            for k in graphed.stats()["per_rank"][0]["graphs"]["keys"] if k["phase"] == "draft_step"}
    run = generate(graphed, PROMPTS, MAX_NEW, config={"speculative_num_steps": 5})
    again = [c for c in _captures(run.records, "draft_step")
             if (c["placement"], c["rows"], tuple(c["shape"])) in held]
    assert again == [], "a draft step's graph does not depend on steps"
    new = [c for c in _captures(run.records) if c["phase"] != "draft_step"]
    assert {c["phase"] for c in new} == {"verify", "draft_extend"}, new   # N = 6 tokens is a new shape
    assert all(c["ok"] and c["shape"][0] == 6 for c in new)
    flagged = [r for r in run.records if r["capture"]]
    assert flagged and all(r["captures"] for r in flagged)
    assert all("captures" not in r for r in run.records if not r["capture"])
    # TP2: the target's all-reduces run inside the verify graph, the sharded draft's inside the
    # draft-step graph: counted per phase, and those phases have no comm time (not measurable).
    r = warm.records[-1]
    assert r["comm_calls_in_graph"]["verify"] > 0 and r["comm_calls_in_graph"]["draft"] > 0
    assert "verify" not in r["comm_ms"] and "draft" not in r["comm_ms"]
    assert r["comm_calls"]["verify"] > r["comm_calls_in_graph"]["verify"], "the tree broadcast is eager"


def test_replicated_draft_graphs_have_no_collectives_and_stats_per_rank(graphed):
    graphed.set_config({"speculative_num_steps": 4, "speculative_eagle_topk": 1,
                        "speculative_draft_placement": "replicated"})
    run = generate(graphed, PROMPTS, MAX_NEW)
    run = generate(graphed, PROMPTS, MAX_NEW)
    r = run.records[-1]
    assert "draft" not in r.get("comm_calls_in_graph", {}) and r["comm_calls"]["draft"] == 0
    assert r["comm_ms"]["draft"] == 0.0
    stats = graphed.stats()["per_rank"]
    for rank in (0, 1):
        g = stats[rank]["graphs"]
        assert g["mode"] == "static" and g["captures"] > 0 and g["replays"] > 0
        keys = {(k["phase"], k["placement"], k["scope"]) for k in g["keys"]}
        assert ("draft_step", "replicated", "local") in keys and ("verify", "-", "group") in keys
        timed = [k for k in g["keys"] if k["replays"]]
        assert timed and all(k["replay_ms_mean"] is not None for k in timed)
    assert stats[0]["comm_graph_calls"]["verify"] > 0


def test_ranks_inherit_the_environment_and_cuda_mode_falls_back_on_cpu(monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    opts = EngineOptions(model_path="tiny-agreeing", load_format="dummy", tp_size=2, threads_per_rank=1,
                         init_timeout_s=30, context_length=128, max_running_requests=2,
                         env={"NCCL_SHM_DISABLE": "1"}, cuda_graph="cuda")
    with EngineClient.start(opts) as client:
        assert [e.get("NCCL_P2P_DISABLE") for e in client.rank_env()] == ["1", "1"]
        assert [e.get("NCCL_SHM_DISABLE") for e in client.rank_env()] == ["1", "1"]
        for g in client.graph_info():
            assert g["mode"] == "off" and "CUDA device" in g["off_reason"]
        run = generate(client, PROMPTS[:2], 8)
        assert all(r["graph_mode"] == "off" and not r["capture"] for r in run.records)
