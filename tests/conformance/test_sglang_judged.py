"""Rows computed by SGLang 0.5.23's own code: the server's per-request statistics and OpenAI shapes,
built by the engine's pure output code, against the wheel's tokenizer-manager formula and protocol
models (tests/conformance/sglang_judge.py). No server: these are the formulas and shapes; the live
rows in test_spec_stats.py and test_openai_routes.py check the running server with the same judge.
"""

from __future__ import annotations

import pytest

from refengine.messages import SpecStats
from refengine.server import openai_shapes
from refengine.server.inputs import Sampling
from refengine.server.outputs import RequestOutput
from tests.conformance.sglang_judge import completion_stream_chunk, spec_meta

SPEC_KEYS = ("spec_accept_rate", "spec_accept_length", "spec_num_correct_drafts", "spec_num_proposed_drafts",
             "spec_verify_ct", "spec_correct_drafts_histogram")


def finished(launch_n: int, completion: int, stats: SpecStats | None) -> RequestOutput:
    o = RequestOutput(rid="r", prompt_tokens=3, sampling=Sampling(max_new_tokens=completion),
                      decode=lambda ids: "x" * len(ids), launch_num_draft_tokens=launch_n)
    o.add([1] * completion, finished=True, reason="length", spec=stats)
    return o


# (launch N, rounds as (accepted, N that round ran)): a fixed chain, a tree, tier 0 only (an
# adaptive launch at N 4 pinned to 0 steps), a live change 4 -> 6 -> 1, a launch at N 1.
CASES = {
    "chain": (4, [(3, 4), (1, 4), (0, 4), (2, 4)]),
    "tree": (6, [(4, 6), (2, 6)]),
    "tier 0 under launch N 4": (4, [(0, 1)] * 7),
    "live change of N": (4, [(3, 4), (5, 6), (4, 6), (0, 1), (0, 1)]),
    "launch N 1": (1, [(0, 1)] * 3),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_spec_meta_is_sglangs_formula(sglang_src, case):
    launch_n, rounds = CASES[case]
    hist = [0] * (max(a for a, _ in rounds) + 1)
    for a, _ in rounds:
        hist[a] += 1
    stats = SpecStats(spec_verify_ct=len(rounds), spec_num_correct_drafts=sum(a for a, _ in rounds),
                      spec_num_proposed_drafts=sum(n - 1 for _, n in rounds), spec_correct_drafts_histogram=hist)
    completion = 1 + sum(a + 1 for a, _ in rounds)
    meta = finished(launch_n, completion, stats).meta_info()
    want = spec_meta(sglang_src, launch_num_draft_tokens=launch_n, verify_ct=len(rounds),
                     correct=stats.spec_num_correct_drafts, completion=completion, histogram=hist)
    assert {k: meta[k] for k in SPEC_KEYS if k in meta} == pytest.approx(want)
    # Our per-round truth stands beside SGLang's keys, whatever the launch N.
    assert meta["specdecode_verify_ct"] == len(rounds)
    assert meta["specdecode_num_proposed_drafts"] == sum(n - 1 for _, n in rounds)
    truth_rate = stats.spec_num_correct_drafts / stats.spec_num_proposed_drafts \
        if stats.spec_num_proposed_drafts else 0.0
    assert meta["specdecode_accept_rate"] == pytest.approx(truth_rate)


def test_tier_zero_under_a_launch_n_reports_every_key(sglang_src):
    """The review's case: a tier-0-only request on a launch at N 4 gets verify_ct, 3 x verify_ct
    proposed, rate 0 and length ~1 from SGLang, not only the histogram."""
    meta = finished(4, 8, SpecStats(7, 0, 0, [7])).meta_info()
    assert meta["spec_verify_ct"] == 7 and meta["spec_num_proposed_drafts"] == 21
    assert meta["spec_accept_rate"] == 0.0 and meta["spec_accept_length"] == pytest.approx(8 / 7)


def test_no_rounds_no_keys(sglang_src):
    meta = finished(4, 1, SpecStats()).meta_info()
    assert spec_meta(sglang_src, launch_num_draft_tokens=4, verify_ct=0, correct=0, completion=1,
                     histogram=[]) == {}
    assert not [k for k in meta if k.startswith(("spec_", "specdecode_"))]


def test_completion_tail_chunk_is_sglangs_serialisation(sglang_src):
    o = finished(4, 5, SpecStats(2, 2, 6, [1, 0, 1]))
    chunks = openai_shapes.completion_tail_chunks("cmpl-1", "m", 1, o, details=True, include_usage=True)
    sglext, usage = chunks
    assert sglext == completion_stream_chunk(sglang_src, sglext)
    assert usage == completion_stream_chunk(sglang_src, usage, exclude_none=True)
