"""Acceptance by context bucket from SGLang's per-request statistics, for a server without our
plugin (no phase stream, so no per-round `ctx`): the session's load driver reads each finished
request's `spec_correct_drafts_histogram`, `prompt_tokens` and `completion_tokens` from the final
SSE chunk and emits the `spec/<bucket>/...` series the phase records would.

sglang_payload_server.py --no-plugin is a STAND-IN for SGLang 0.5.23 alone serving the
recorded-shape stream (generate_stream.txt: prompt 42, completion 106, histogram [3, 4, 6, 9, 8]).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import wait_until
from probes import accept_buckets as AB
from tuner.backends import connect
from tuner.core import series as S
from tuner.core.session import Session

STREAM = Path(__file__).with_name("fixtures") / "generate_stream.txt"


@pytest.fixture(scope="module")
def alone(start_payload_server):
    with start_payload_server("--no-plugin") as url:
        yield url


def _final_meta() -> dict:
    chunks = [json.loads(line[5:]) for line in STREAM.read_text().splitlines()
              if line.startswith("data:") and line.strip() != "data: [DONE]"]
    return chunks[-1]["meta_info"]


def _summed(session: Session, name: str) -> float:
    return sum(session.store.window(name).v)


def test_requests_statistics_fill_the_context_bucket_of_their_middle_round(alone):
    meta = _final_meta()
    h = meta["spec_correct_drafts_histogram"]
    bucket = AB.bucket(AB.CTX, meta["prompt_tokens"] + meta["completion_tokens"] // 2)
    session = Session(connect(alone))
    session.start()
    try:
        assert not session.backend.capabilities.HAS_PHASE_STREAM
        load = session.start_load([{"text": "x"}], concurrency=2, max_new_tokens=106)
        assert load.context_buckets                       # chosen because there is no phase stream
        wait_until(lambda: (session.tick(), _summed(session, S.bucket_verifies(bucket)) >= 3 * sum(h))[-1],
                   60, "three requests' verify rounds in the bucket", interval=0.02)
        session.stop_load()
        session.tick()
    finally:
        session.close()
    verifies = session.store.window(S.bucket_verifies(bucket)).v
    assert sum(verifies) % sum(h) == 0                    # whole requests, each counted once
    # every reading is of whole requests, with the stream's own p_k
    want = AB.position_acceptance(h, len(h) - 1).p
    for k in range(1, len(h)):
        got = session.store.window(S.bucket_accept_pos(bucket, k)).v
        assert got and all(v == pytest.approx(want[k - 1]) for v in got), (k, got)
    assert session.store.series_names("spec/bs") == []      # no batch buckets from requests
