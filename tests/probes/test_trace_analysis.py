"""GPU-mode analysis on the hand-made SGLang-shaped fixtures, and the interval logic as properties.

Expected numbers (per iteration, both ranks; fixtures/make_sglang_gpu.py has the layout):
draft 100 us of kernels (30 NCCL; rank 1: 20), verify 150 (prep 10 + graph 140, 40 NCCL),
verify_sample 20, draft_extend 30 (10 custom all-reduce), other 15; busy 315; wall 1000 / 850 us
(the last iteration ends at its last kernel). CPU spans: draft 200, verify 300 (100 gap + 200
step[VERIFY]), verify_sample 100, draft_extend 150, other 250.
Rank 1's prefill batch (a 500-us run_batch: step[EXTEND, draft_extend, one 100-us kernel) counts in
its first iteration as prefill: prefill 100 us of kernels and 500 us of span, the 100-us gap to the
decode batch is other, busy 415, wall 1560 (prefill kernel at -500 to the next iteration's first).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.trace_analysis import (
    TraceAnalysisError, analyze_file, analyze_path, find_rank_files, flatten_spans, merge_intervals,
    overlap_per_segment,
)
from probes.trace_names import INHERIT, is_comm_cpu, is_comm_kernel, span_kind

FIXTURES = Path(__file__).parent / "fixtures" / "sglang_gpu"


@pytest.fixture(scope="module")
def gpu():
    return analyze_path(FIXTURES).to_dict()


def test_gpu_mode_and_iterations(gpu):
    assert gpu["mode"] == "gpu"
    assert [r["rank"] for r in gpu["ranks"]] == [0, 1]
    for r in gpu["ranks"]:
        assert r["derived_verify"] is True
        assert len(r["iterations"]) == 2  # rank 1's prefill batch joins its first iteration
    assert [it["wall_ms"] for it in gpu["ranks"][0]["iterations"]] == [1.0, 0.85]
    assert [it["wall_ms"] for it in gpu["ranks"][1]["iterations"]] == [1.56, 0.85]
    assert gpu["phases"][0] == "prefill"


@pytest.mark.parametrize("rank, draft_comm", [(0, 0.03), (1, 0.02)])
def test_gpu_phase_split_matches_hand_computation(gpu, rank, draft_comm):
    for it in gpu["ranks"][rank]["iterations"]:  # iteration 2 is linked only through flow events
        ph = it["phases"]
        prefill = rank == 1 and it["index"] == 0   # the prefill batch before it
        assert {p: ph[p]["ms"] for p in ph} == {
            "prefill": 0.1 if prefill else 0.0,
            "draft": 0.1, "verify": 0.15, "verify_sample": 0.02, "draft_extend": 0.03, "other": 0.015}
        assert {p: ph[p]["comm_ms"] for p in ph} == {
            "prefill": 0.0,
            "draft": draft_comm, "verify": 0.04, "verify_sample": 0.0, "draft_extend": 0.01, "other": 0.0}
        assert {p: ph[p]["span_ms"] for p in ph} == {
            "prefill": 0.5 if prefill else 0.0,
            "draft": 0.2, "verify": 0.3, "verify_sample": 0.1, "draft_extend": 0.15,
            "other": 0.35 if prefill else 0.25}
        busy = 0.415 if prefill else 0.315
        assert it["busy_ms"] == busy
        assert it["idle_ms"] == pytest.approx(it["wall_ms"] - busy)


def test_gpu_unattributed_kernel_is_reported(gpu):
    r0 = gpu["ranks"][0]
    assert r0["unattributed_kernels"] == 1 and r0["unattributed_ms"] == 0.004
    assert any("no launching call" in w for w in gpu["warnings"])


def test_cross_rank_aligned_by_draft_not_clock(gpu):
    a = gpu["across"]
    assert a["aligned_iterations"] == 2  # rank 1's clock is 1 s later and it had a prefill first
    assert a["slowest_rank"] == 1
    # 10 us more compute per iteration on rank 1, and its 100-us prefill kernel in the first
    assert a["skew_ms"] == pytest.approx(0.12)
    assert a["phases"]["prefill"]["slowest_rank"] == 1 and a["phases"]["prefill"]["skew_ms"] == pytest.approx(0.1)
    assert a["phases"]["draft"]["slowest_rank"] == 1
    assert a["phases"]["draft"]["skew_ms"] == pytest.approx(0.02)
    assert a["phases"]["verify"]["skew_ms"] == 0.0
    json.dumps(gpu)  # the stored form is plain JSON


def test_directory_with_two_captures_is_refused(tmp_path):
    for name in ("a-TP-0.trace.json", "b-TP-0.trace.json"):
        (tmp_path / name).write_text('{"traceEvents": []}')
    with pytest.raises(TraceAnalysisError, match="2 captures"):
        find_rank_files(tmp_path)


def test_trace_with_neither_kernels_nor_phases_is_refused(tmp_path):
    p = tmp_path / "x-TP-0.trace.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}))
    with pytest.raises(TraceAnalysisError, match="neither GPU kernels nor phase spans"):
        analyze_file(p)


def test_gpu_trace_without_spans_is_all_other(tmp_path):
    p = tmp_path / "x-TP-0.trace.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 1, "pid": 1, "tid": 1,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 10, "dur": 30, "pid": 0, "tid": 7,
         "args": {"correlation": 5}}]}))
    r = analyze_file(p).to_dict()
    # an all-gather is a collective but not an all-reduce
    assert r["mode"] == "gpu" and r["total"]["phases"]["other"] == {"ms": 0.03, "comm_ms": 0.03, "span_ms": 0.04,
                                                                    "ar_ms": 0.0, "ar_calls": 0.0,
                                                                    "comm_calls": 1.0}


def test_all_reduces_are_split_out_of_the_collectives_per_phase(tmp_path):
    """NCCL all-reduce and all-gather kernels launched inside a draft span and a verify span: the
    all-reduces' time and count per phase, the all-gather only in comm_ms."""
    p = tmp_path / "x-TP-0.trace.json"
    ev = [{"ph": "X", "cat": "user_annotation", "name": "draft", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "user_annotation", "name": "step[VERIFY bs=2]", "ts": 100, "dur": 100, "pid": 1,
           "tid": 1},
          {"ph": "X", "cat": "user_annotation", "name": "draft", "ts": 300, "dur": 10, "pid": 1, "tid": 1}]
    kernels = [(1, 10, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 20, 10),
               (2, 20, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 40, 10),
               (3, 30, "ncclDevKernel_AllGather_RING_LL", 60, 10),
               (4, 110, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 120, 30),
               (5, 120, "sm90_xmma_gemm", 160, 20)]
    for corr, launch, name, ts, dur in kernels:
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 1, "pid": 1,
                   "tid": 1, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
                   "args": {"correlation": corr}})
    p.write_text(json.dumps({"traceEvents": ev}))
    ph = analyze_file(p).to_dict()["total"]["phases"]
    assert ph["draft"]["comm_ms"] == 0.03 and ph["draft"]["ar_ms"] == 0.02 and ph["draft"]["ar_calls"] == 2
    assert ph["draft"]["comm_calls"] == 3
    assert ph["verify"]["ar_ms"] == 0.03 and ph["verify"]["ar_calls"] == 1


def test_names():
    assert span_kind("draft") == "draft" and span_kind("draft_extend") == "draft_extend"
    assert span_kind("step[VERIFY bs=8]") == "verify" and span_kind("step[DRAFT bs=8]") == INHERIT
    assert span_kind("specdecode.verify_sample") == "verify_sample"
    assert span_kind("scheduler.recv_requests") is None
    assert span_kind("step[EXTEND bs=1 toks=9]") == "prefill"
    assert span_kind("specdecode.prefill") == span_kind("specdecode.prefill_draft_extend") == "prefill"
    for k in ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclKernel_AllGather_RING", "cross_device_reduce_2stage",
              "all_reduce_1shot_push_kernel", "void flashinfer::PcieIpcAllReduceKernel"):
        assert is_comm_kernel(k), k
    for k in ("sm90_xmma_gemm_bf16bf16", "flash_fwd_kernel", "void at::native::reduce_kernel<512, 1>"):
        assert not is_comm_kernel(k), k
    assert is_comm_cpu("specdecode.comm.broadcast") and is_comm_cpu("c10d::allreduce_") and is_comm_cpu("gloo:all_reduce")
    assert not is_comm_cpu("aten::mm")


# -- properties of the interval logic --------------------------------------------------------------

intervals = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 50)).map(lambda t: (t[0], t[0] + t[1])), max_size=25)


def _cover(ivs, lo=0, hi=260):
    return {t for t in range(lo, hi) if any(s <= t < e for s, e in ivs)}


@settings(max_examples=150, deadline=None)
@given(intervals)
def test_merge_is_the_union(ivs):
    merged = merge_intervals([x for iv in ivs for x in iv])
    assert all(a[1] < b[0] for a, b in zip(merged, merged[1:]))  # disjoint, sorted, not touching
    assert _cover(merged) == _cover(ivs)


@settings(max_examples=150, deadline=None)
@given(intervals, intervals)
def test_overlap_per_segment_counts_covered_length(segs, ivs):
    segs = merge_intervals([x for iv in segs for x in iv])
    work = merge_intervals([x for iv in ivs for x in iv])
    got = overlap_per_segment(segs, work)
    assert got == [len(_cover([s]) & _cover(work)) for s in segs]


@st.composite
def nested_spans(draw, lo=0, hi=300, depth=0):
    out = []
    t = lo
    while t < hi and len(out) < 4:
        s = draw(st.integers(t, hi))
        e = draw(st.integers(s, hi))
        if e == s:
            break
        label = draw(st.sampled_from(["draft", "verify", "draft_extend", INHERIT]))
        out.append((s, e, label))
        if depth < 2 and e - s > 2:
            out += draw(nested_spans(s + 1, e - 1, depth + 1))
        t = e
    return out


@settings(max_examples=150, deadline=None)
@given(nested_spans())
def test_flatten_labels_every_instant_by_its_innermost_span(spans):
    segs = flatten_spans(spans)
    assert all(a[1] <= b[0] for a, b in zip(segs, segs[1:]))
    assert _cover([(s, e) for s, e, _ in segs], hi=301) == _cover([(s, e) for s, e, _ in spans], hi=301)
    for s, e, label in segs:
        t = s
        covering = [sp for sp in spans if sp[0] <= t < sp[1]]
        # innermost = the latest-starting (then shortest) span holding t; INHERIT climbs outward
        covering.sort(key=lambda sp: (sp[0], -sp[1]))
        want = next((sp[2] for sp in reversed(covering) if sp[2] != INHERIT), "draft")
        assert label == want


def test_sparse_correlation_ids_and_kernels_out_of_order(tmp_path):
    # ids far apart take the dict path of the launch index; kernels listed out of time order
    def rt(ts, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1,
                "pid": 1, "tid": 1, "args": {"correlation": corr}}

    def k(name, ts, dur, corr):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
                "args": {"correlation": corr}}

    span = {"ph": "X", "cat": "user_annotation", "name": "draft", "ts": 0, "dur": 50, "pid": 1, "tid": 1}
    verify = {"ph": "X", "cat": "user_annotation", "name": "step[VERIFY bs=1]", "ts": 60, "dur": 40, "pid": 1, "tid": 1}
    p = tmp_path / "x-TP-0.trace.json"
    p.write_text(json.dumps({"traceEvents": [span, verify, rt(10, 5), rt(70, 10**12),
                                             k("ncclDevKernel_AllReduce", 200, 20, 10**12), k("gemm", 100, 30, 5)]}))
    it = analyze_file(p).to_dict()["total"]
    assert it["phases"]["draft"]["ms"] == 0.03 and it["phases"]["verify"]["comm_ms"] == 0.02
    assert it["busy_ms"] == 0.05


def test_merged_trace_of_several_ranks_is_refused(tmp_path):
    evs = [{"ph": "X", "cat": "user_annotation", "name": "draft", "ts": 0, "dur": 5, "pid": f"[TP0{r}] 12{r}", "tid": 1}
           for r in (0, 1)]
    p = tmp_path / "merged-1.trace.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    with pytest.raises(TraceAnalysisError, match="merged trace of 2 ranks"):
        analyze_file(p)


@pytest.mark.parametrize("prefill, prefill_extend, sample", [
    ("specdecode.prefill", "specdecode.prefill_draft_extend", True),   # our engine
    ("step[EXTEND bs=1 toks=5]", "draft_extend", False),                # SGLang without run_batch spans
])
def test_prefill_between_iterations_counts_in_the_next(tmp_path, prefill, prefill_extend, sample):
    def span(name, ts, end):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": end - ts, "pid": 1, "tid": 1}

    def iteration(t):
        out = [span("draft", t, t + 100), span("step[VERIFY bs=1]", t + 120, t + 200),
               span("draft_extend", t + 220, t + 300)]
        return out + ([span("specdecode.verify_sample", t + 200, t + 220)] if sample else [])

    evs = iteration(0) + [span(prefill, 320, 400), span(prefill_extend, 400, 450)] + iteration(500)
    p = tmp_path / "x-TP-0.trace.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    its = analyze_file(p).to_dict()["iterations"]
    assert [(it["start_us"], it["wall_ms"]) for it in its] == [(0, 0.32), (320, 0.48)]
    assert [it["phases"]["prefill"]["span_ms"] for it in its] == [0.0, 0.13]
    # The decode draft_extend stays draft_extend; only the one after a prefill is the draft's prefill.
    assert [it["phases"]["draft_extend"]["span_ms"] for it in its] == [0.08, 0.08]
    # Other: the gap before the prefill stays in the iteration before it, the one after it moves
    # with it (and the draft-to-verify gap is other where the engine names verify_sample itself).
    gap = 0.02 if sample else 0.0
    assert [it["phases"]["other"]["span_ms"] for it in its] == [0.02 + gap, 0.05 + gap]


def test_a_prefill_after_the_last_iteration_is_left_out(tmp_path):
    # The profiler stops after admitting requests whose iteration it does not see.
    def span(name, ts, end):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": end - ts, "pid": 1, "tid": 1}

    evs = [span("draft", 0, 100), span("step[VERIFY bs=1]", 120, 200), span("specdecode.verify_sample", 200, 220),
           span("draft_extend", 220, 300), span("specdecode.prefill", 320, 400)]
    p = tmp_path / "x-TP-0.trace.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    [it] = analyze_file(p).to_dict()["iterations"]
    assert it["wall_ms"] == 0.32 and it["phases"]["prefill"]["span_ms"] == 0.0
