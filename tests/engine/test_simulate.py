"""The acceptance simulator: all draft and verify compute runs, acceptance follows the requested
curve or mean accept length, and every record says it is simulated."""

from __future__ import annotations

import pytest
import torch

from refengine import presets
from refengine.comm import Communicator
from refengine.config import ConfigError, EngineOptions, SpecConfig, parse_simulate_accept
from refengine.engine import Engine
from refengine.messages import GenRequest

torch.set_num_threads(1)


def _run(sim: str, cfg: SpecConfig, model: str = "tiny", iters: int = 60) -> list[dict]:
    opts = EngineOptions(max_running_requests=4, context_length=512, speculative_simulate_accept=sim)
    e = Engine(opts, Communicator(0, 1), presets.build_target(model), presets.build_head(f"{model}-eagle3"),
               torch.device("cpu"), torch.float32)
    e.apply_config(cfg)
    for i in range(4):
        e.add_request(GenRequest(f"s{i}", [3 + i, 5, 7], max_new_tokens=400, ignore_eos=True))
    records = [e.step()[1] for _ in range(iters)]
    return [r for r in records if r is not None]   # overlapped, the first step only launches


@pytest.mark.parametrize("cfg", [SpecConfig(steps=4, num_draft_tokens=5, epoch=1),
                                 SpecConfig(steps=3, topk=2, num_draft_tokens=10, epoch=1)])
def test_mean_accept_length_is_forced(cfg):
    # Random weights accept almost nothing by themselves: τ ≈ 1 without the simulator.
    recs = _run("2.5", cfg)
    assert all(r["simulated"] for r in recs)
    acc = [a for r in recs for a in r["accepted"]]
    tau = 1 + sum(acc) / len(acc)
    assert abs(tau - 2.5) < 0.25, tau


def test_curve_is_forced_per_position():
    recs = _run("0.9,0.5,0.0", SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    acc = torch.tensor([a for r in recs for a in r["accepted"]], dtype=torch.float64)
    p1, p2, p3 = ((acc >= k).double().mean().item() for k in (1, 2, 3))
    assert abs(p1 - 0.9) < 0.08 and abs(p2 - 0.45) < 0.1 and p3 == 0.0


def test_simulator_parse_errors_and_solver():
    assert parse_simulate_accept(None) is None
    a = parse_simulate_accept("3").alphas(2)
    assert abs(sum(a[0] ** i for i in range(3)) - 3.0) < 1e-9     # τ(2 steps) = 3 → α = 1
    with pytest.raises(ConfigError, match="values in"):
        parse_simulate_accept("0.5,1.5")
    with pytest.raises(ConfigError, match="mean accept length"):
        parse_simulate_accept("fast")


@pytest.mark.parametrize("no_overlap", [False, True])
def test_records_carry_each_requests_context_before_the_commit(no_overlap):
    # ctx[i] is request i's KV length when the iteration started: the prompt, then + (accepted + 1)
    # per iteration, so it follows from the records alone.
    opts = EngineOptions(max_running_requests=4, context_length=512, speculative_simulate_accept="0.7",
                         disable_overlap_schedule=no_overlap)
    e = Engine(opts, Communicator(0, 1), presets.build_target("tiny"), presets.build_head("tiny-eagle3"),
               torch.device("cpu"), torch.float32)
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    prompts = [[3, 5, 7], [2, 4, 6, 8, 10]]
    for i, p in enumerate(prompts):
        e.add_request(GenRequest(f"c{i}", p, max_new_tokens=100, ignore_eos=True))
    # After prefill a request's KV holds its prompt (the first output token is the next root).
    want = [len(p) for p in prompts]
    for _ in range(12):
        rec = e.step()[1]
        if rec is None:      # overlapped, the first step only launches
            continue
        assert rec["ctx"] == want and len(rec["ctx"]) == len(rec["accepted"]) == rec["bs"]
        want = [c + a + 1 for c, a in zip(want, rec["accepted"])]


def test_a_profile_drives_the_simulator_through_its_conditional_rates():
    from probes.speculation_profile import build
    from refengine.config import refuse_for_simulator, simulator
    # Conditional rates 0.9, 0.5, 0.0 (the histogram's): position 3 is never accepted.
    profile = build([10, 45, 45, 0], 3, chain=True)
    opts = EngineOptions(max_running_requests=4, context_length=512, speculative_simulate_accept_profile=profile)
    e = Engine(opts, Communicator(0, 1), presets.build_target("tiny"), presets.build_head("tiny-eagle3"),
               torch.device("cpu"), torch.float32)
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    for i in range(4):
        e.add_request(GenRequest(f"p{i}", [3 + i, 5, 7], max_new_tokens=400, ignore_eos=True))
    recs = [r for r in (e.step()[1] for _ in range(60)) if r is not None]
    assert all(r["simulated"] for r in recs)
    acc = torch.tensor([a for r in recs for a in r["accepted"]], dtype=torch.float64)
    p1, p2, p3 = ((acc >= k).double().mean().item() for k in (1, 2, 3))
    assert abs(p1 - 0.9) < 0.08 and abs(p2 - 0.45) < 0.1 and p3 == 0.0
    with pytest.raises(ConfigError, match="max_supported_k 3"):
        refuse_for_simulator(simulator(opts), SpecConfig(steps=4, num_draft_tokens=5))
    refuse_for_simulator(simulator(opts), SpecConfig(steps=2, num_draft_tokens=3))


def test_a_request_carries_its_own_curve_and_the_others_keep_the_launchs():
    # A workload whose acceptance differs by request (code against chat): rows of one batch draw
    # from their own curves. Without the simulator at launch, a curve is refused for that request.
    opts = EngineOptions(max_running_requests=4, context_length=512, speculative_simulate_accept="0.5")
    e = Engine(opts, Communicator(0, 1), presets.build_target("tiny"), presets.build_head("tiny-eagle3"),
               torch.device("cpu"), torch.float32)
    e.apply_config(SpecConfig(steps=3, num_draft_tokens=4, epoch=1))
    curves = {"all": (1.0,), "none": (0.0,), "launch": (), "first": (1.0, 0.0)}
    for rid, c in curves.items():
        assert e.add_request(GenRequest(rid, [3, 5, 7], max_new_tokens=400, ignore_eos=True, simulate_accept=c)) is None
    stats = {}
    for _ in range(40):
        for u in e.step()[0]:
            if u.spec is not None:
                stats[u.rid] = u.spec
    rate = {rid: s.spec_num_correct_drafts / s.spec_num_proposed_drafts for rid, s in stats.items()}
    assert rate["all"] == 1.0 and rate["none"] == 0.0 and abs(rate["first"] - 1 / 3) < 1e-9
    assert 0.15 < rate["launch"] < 0.45            # 0.5, 0.25, 0.125 per position: 0.29 of proposed
    plain = Engine(EngineOptions(max_running_requests=4, context_length=512), Communicator(0, 1),
                   presets.build_target("tiny"), presets.build_head("tiny-eagle3"), torch.device("cpu"), torch.float32)
    refused = plain.add_request(GenRequest("x", [3, 5], max_new_tokens=4, simulate_accept=(0.5,)))
    assert refused.finish_reason == "error" and "acceptance simulator" in refused.error
    bad = GenRequest("y", [3, 5], max_new_tokens=4, simulate_accept=(1.5,)).problem(256)
    assert bad and bad.startswith("simulate_accept:")
