"""The communication what-if's arithmetic (tuner/tuning/comm_whatif): SGLang's PCIe-IPC remedy from a
capture's per-phase all-reduces and the plugin's path report, its bound, draft placement for
reference, and the engine's emulated latency. Pure logic on constructed inputs; the end-to-end check
of the emulation against a real relaunch is benchmarks/comm_latency_whatif.py."""

from __future__ import annotations

import math

import pytest

from tuner.tuning.comm_whatif import (
    E2E_BOUND, emulated, ipc_speedup, pcie_ipc, pcie_ipc_offer, placement_reference, remedies_for, remedy_lines,
)


def _iter(wall=20.0, draft=(6.0, 4.0, 2.0, 6), verify=(9.0, 3.0, 3.0, 65), extend=(2.0, 1.0, 0.8, 3)):
    def ph(ms, comm, ar, calls):
        return {"ms": ms, "comm_ms": comm, "ar_ms": ar, "ar_calls": calls, "span_ms": ms}
    return {"wall_ms": wall, "phases": {"draft": ph(*draft), "verify": ph(*verify), "draft_extend": ph(*extend),
                                        "verify_sample": ph(0.5, 0, 0, 0), "other": ph(0.2, 0, 0, 0)}}


def _report(path="nccl", ws=8, **kw):
    paths = {"draft": {str(b): path for b in (1, 2, 4, 8)}, "verify": {str(b): path for b in (1, 2, 4, 8)}}
    return {"world_size": ws, "hidden": 4096, "paths": paths, "full_nvlink": False, "deterministic": False, **kw}


def test_speedup_is_sglangs_table_interpolated():
    assert ipc_speedup(12 * 1024) == pytest.approx(205.1 / 5.3)
    assert ipc_speedup(384 * 1024) == pytest.approx(1169.3 / 34.6)
    assert ipc_speedup(1024) == pytest.approx(205.1 / 5.3)            # flat below the table
    assert 1169.3 / 34.6 > ipc_speedup(1 << 20) > 50400 / 8500.0


def test_nccl_on_pcie_is_replaced_per_phase_and_bounded():
    p = pcie_ipc(_iter(), _report(), bs=4, draft_tokens=4)
    assert p.ok and [x.phase for x in p.phases] == ["draft", "verify", "draft_extend"]
    d = p.phases[0]
    assert d.rows == 4 and d.nbytes == 4 * 4096 * 2 and d.saved_ms == pytest.approx(2.0 * (1 - 1 / d.speedup))
    raw = 20.0 / (20.0 - sum(x.saved_ms for x in p.phases))
    assert p.unbounded_ratio == pytest.approx(raw)
    assert p.bounded == (raw > E2E_BOUND) and p.ratio == pytest.approx(min(raw, E2E_BOUND))
    small = pcie_ipc(_iter(draft=(6, 0.4, 0.2, 6), verify=(9, 0.3, 0.3, 65), extend=(2, 0.1, 0.1, 3)),
                     _report(), bs=4, draft_tokens=4)
    assert not small.bounded and 1 < small.ratio < E2E_BOUND


@pytest.mark.parametrize("report, words", [
    (_report(path="ca"), "already run on ca"),
    (_report(path="pcie_ipc"), "already on PCIe-IPC"),
    (_report(ws=6), "TP 2, 4 or 8, not 6"),
    (_report(deterministic=True), "deterministic"),
])
def test_what_pcie_ipc_cannot_change_says_why(report, words):
    p = pcie_ipc(_iter(), report, bs=2, draft_tokens=4)
    assert not p.ok and words in p.reason


def test_without_per_call_times_or_a_report():
    old = _iter()
    for t in old["phases"].values():
        del t["ar_ms"], t["ar_calls"]
    assert "capture again" in pcie_ipc(old, _report(), 1, 4).reason
    p = pcie_ipc(_iter(), None, 1, 4, hidden=4096)
    assert p.ok and "taken as NCCL" in p.notes[0]
    assert "hidden size is unknown" in pcie_ipc(_iter(), None, 1, 4).reason


def test_placement_reference_and_the_wording():
    low, high = placement_reference(_iter(), 8)
    assert high == pytest.approx(20 / (20 - 5.0)) and low == pytest.approx(20 / (20 - 5.0 + 3.0 * 7))
    assert placement_reference(_iter(), 1) is None
    lines = remedy_lines("sglang", pcie_ipc(_iter(), _report(), 4, 4), (low, high), pinnable=[1, 3])
    assert lines[0].startswith("steps: live among the pinnable tiers 1 3")
    assert "relaunch with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1" in lines[1] and "pcie_ipc_ar.py" in lines[1]
    assert "not an SGLang 0.5.23 setting, for reference" in lines[-1]


def test_emulated_latency_moves_every_collective():
    p = emulated(30.0, {"draft": 12, "verify": 17, "draft_extend": 4}, old_us=200, new_us=0)
    assert p.predicted_ms == pytest.approx(30.0 - 33 * 0.2) and "emulation" in p.notes[0]
    assert emulated(5.0, {"draft": 100}, 0, 0).ratio == pytest.approx(1.0)
    assert "larger than the iteration" in emulated(5.0, {"draft": 100}, 200, 0).reason
    assert not math.isfinite(emulated(5.0, {}, 200, 0).ratio)


def _analysis(**kw):
    return {"ranks": [{"rank": 0, "mean": _iter(**kw)}]}


def test_remedies_for_sglang_with_and_without_a_capture():
    info = {"kind": "sglang", "tp_size": 8, "active": {"speculative_num_draft_tokens": 4},
            "allreduce": _report()}
    before = remedies_for(info, None, 4.0, [1, 3])
    assert any("needs a capture (c)" in x for x in before) and before[0].startswith("steps: live")
    after = remedies_for(info, _analysis(), 4.0, [1, 3])
    assert any("relaunch with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1: decode iteration 20.00" in x for x in after)
    assert any("not an SGLang 0.5.23 setting" in x for x in after)
    assert pcie_ipc_offer(info) and not pcie_ipc_offer({**info, "allreduce": _report(path="ca")})
    assert not pcie_ipc_offer({**info, "allreduce": {**_report(), "full_nvlink": True}})
    assert not pcie_ipc_offer({**info, "allreduce": _report(pcie_ipc_env=True)})


def test_remedies_for_the_engine_are_labelled_emulation():
    a = _analysis()
    for t in a["ranks"][0]["mean"]["phases"].values():
        t["comm_calls"] = 10
    info = {"kind": "refengine", "tp_size": 2, "launch": {"emulate_comm_latency": "200"}, "active": {}}
    [line] = remedies_for(info, a, 2.0)
    assert "20.00 → 10.00 ms" in line and "an emulation, not hardware" in line
    assert remedies_for({**info, "launch": {}}, a, 2.0) == []


def test_collectives_per_iteration_are_labelled_computed():
    info = {"kind": "sglang", "tp_size": 8, "active": {"speculative_num_draft_tokens": 4, "speculative_num_steps": 3},
            "collectives": {"draft_forward": {"all_reduce": 3, "all_gather": 1},
                            "target_forward": {"all_reduce": 161, "all_gather": 1}}}
    line = remedies_for(info, None, 1.0)[-1]
    assert line == ("collectives per iteration at steps 3 (computed from the module trees): draft 6 all-reduce + "
                    "2 all-gather, verify 161 all-reduce + 1 all-gather, draft_extend 3 all-reduce + 1 all-gather")


def test_tune_says_which_steps_a_launch_cannot_pin():
    from tuner.backends.base import Capabilities
    from tuner.tuning.settings import steps_left_out

    caps = Capabilities(settable=frozenset({"speculative_num_steps"}), live_values={"speculative_num_steps": (0, 1, 3, 5, 7)},
                        value_refusal=lambda k, v: f"steps {v} cannot be pinned on this launch: … fix: sglang-flags")
    assert steps_left_out(caps, 5) == "steps 2, 4 left out: steps 2 cannot be pinned on this launch: … fix: sglang-flags"
    assert steps_left_out(Capabilities(settable=frozenset({"speculative_num_steps"})), 5) == ""
