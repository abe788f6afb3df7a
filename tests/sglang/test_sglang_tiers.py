"""probes/sglang_tiers predicts what SGLang 0.5.23's own code computes: its decode CUDA-graph sizes
for a speculative launch, its `_route` (pad to a graph size, then the nearest slot at or below),
and `cuda_graph_bs_for_step`. SGLang's definitions are compiled from the wheel
(sglang_wheel_code.load_definitions); the stand-ins for what they import are named at the call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from probes import sglang_tiers as T
from sglang_wheel_code import load_definitions

ASP = "sglang.srt.speculative.adaptive_spec_params"
HOOK = "sglang.srt.arg_groups.cuda_graph_hook"

CONFIGS = [
    None,                                                      # SGLang's DEFAULT_ADAPTIVE_CONFIG
    {"1": {"candidate_steps": [1, 2, 3, 4, 5]}},
    {"1": {"candidate_steps": [2, 4]}, "5": {"candidate_steps": [1, 2]}, "33": {"candidate_steps": [0, 1]},
     "100": {"candidate_steps": [0]}},
]


@pytest.fixture(scope="module")
def wheel(sglang_target):
    src = sglang_target / "sglang"
    # resolving_view(server_args): a stand-in returning the two fields the generator reads
    hook = load_definitions(src, HOOK, ["generate_decode_cuda_graph_batch_sizes"],
                            {"resolving_view": lambda args: args})
    # log_info_on_rank0: a stand-in logger call (one process)
    asp = load_definitions(src, ASP, ["DEFAULT_ADAPTIVE_CONFIG", "_load_adaptive_config", "AdaptiveStepSlot",
                                      "AdaptiveSpeculativeParams"],
                           {"log_info_on_rank0": lambda logger, msg: None})
    return SimpleNamespace(hook=hook, asp=asp)


@pytest.mark.parametrize("max_bs", [1, 4, 7, 8, 9, 33, 48, 64, 100, 160, 256, 300, 512])
@pytest.mark.parametrize("padding", [True, False])
def test_decode_graph_sizes_are_sglangs(wheel, max_bs, padding):
    args = SimpleNamespace(disable_cuda_graph_padding=not padding, speculative_algorithm="EAGLE3")
    assert T.decode_graph_bs(max_bs, padding) == wheel.hook.generate_decode_cuda_graph_batch_sizes(args, max_bs)


def _params(wheel, cfg, tmp_path, graph_bs):
    path = None
    if cfg is not None:
        path = tmp_path / "adaptive.json"
        path.write_text(__import__("json").dumps(cfg))
    p = wheel.asp.AdaptiveSpeculativeParams(initial_steps=1, cfg_path=None if path is None else str(path))
    p.set_cuda_graph_bs(graph_bs)
    return p


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("max_bs", [6, 48, 130])
def test_route_coverage_and_graph_sizes_match_sglangs(wheel, tmp_path, cfg, max_bs):
    graph_bs = T.decode_graph_bs(max_bs)
    p = _params(wheel, cfg, tmp_path, graph_bs)
    slots = {bs: s.candidate_steps for bs, s in p._slots.items()}
    for bs in range(1, max_bs + 20):
        assert slots[T.route(bs, slots, graph_bs)] == p._route(bs).candidate_steps, bs
    launch = slots[min(slots)][0]
    for step in p.candidate_steps:
        ours = T.graph_bs_for_step(step, slots, graph_bs, launch)
        assert ours == (graph_bs if step == launch else p.cuda_graph_bs_for_step(step)), step
    # what the plugin publishes (SGLang's _route) == what sglang-flags predicts (ours)
    real = T.coverage(lambda bs: p._route(bs).candidate_steps, p.candidate_steps, launch, True, max_bs)
    pred = T.coverage(lambda bs: slots[T.route(bs, slots, graph_bs)], p.candidate_steps, launch, True, max_bs)
    assert real == pred


def test_ranges_and_their_text():
    assert T.ranges_where(lambda b: b < 4 or 8 <= b <= 9, 12) == [[1, 3], [8, 9]]
    assert T.ranges_text([[1, 3], [8, 8]]) == "bs 1-3, 8" and T.ranges_text([]) == "no batch size"
    assert T.everywhere([[1, 48]], 48) and not T.everywhere([[1, 7]], 48)
    assert T.runners(0) == 2 and T.runners(1) == 2 and T.runners(2) == 3
