"""A failure in one request's decode work fails that request alone, on the session's real
`serve --tp-size 2`: the request gets the server's failed-request reply, its slot comes back, the
streams decoding beside it finish whole and unchanged, and the ranks carry on in lock-step.

The fault is the engine's own hook (refengine.engine.FAULT_ENV, set on the shared server to
harness.FAULT_RID): every rank raises inside verify_sample for a request with that id prefix.
Before, any exception there was a RankError that ended every rank and the server."""

from __future__ import annotations

import threading

import httpx
import pytest

from harness import FAULT_RID, TP2_ENV, rank_pids, wait_until
from refengine.engine import FAULT_ENV
from refengine.server import sse

from .test_http import PROMPT_IDS, gen

pytestmark = pytest.mark.slow

GOOD_TOKENS = 96


def _stream(base: str, rid: str, n: int, first: threading.Event, out: dict) -> None:
    with httpx.Client(base_url=base, timeout=120) as c, c.stream("POST", "/generate", json={
            "input_ids": PROMPT_IDS, "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}) as r:
        body = b""
        for chunk in r.iter_bytes():
            body += chunk
            if b"data: {" in body:
                first.set()
        out[rid] = sse.parse(body)


def test_a_request_failing_in_verify_sample_fails_alone(http, base):
    assert TP2_ENV == {FAULT_ENV: FAULT_RID}
    pids = rank_pids(base)
    assert len(pids) == 2
    out: dict[str, list] = {}
    firsts = [threading.Event(), threading.Event()]
    good = [threading.Thread(target=_stream, args=(base, f"decode-fault-good-{i}", GOOD_TOKENS, firsts[i], out))
            for i in range(2)]
    for t in good:
        t.start()
    wait_until(lambda: all(e.is_set() for e in firsts), 120, "both good streams' first chunk")

    # While they decode: one non-streaming and one streaming request that fail in verify_sample.
    r = http.post("/generate", json={"input_ids": PROMPT_IDS, "rid": FAULT_RID + "plain",
                                     "sampling_params": {"max_new_tokens": 16, "temperature": 0}})
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "verify_sample failed" in message and "injected fault" in message and "\n" not in message, message
    bad_first = threading.Event()
    bad = threading.Thread(target=_stream, args=(base, FAULT_RID + "stream", 16, bad_first, out))
    bad.start()
    for t in (*good, bad):
        t.join(180)
        assert not t.is_alive()

    events = out[FAULT_RID + "stream"]
    assert events[-1] == "[DONE]" and "verify_sample failed" in events[-2]["error"]["message"], events[-3:]
    assert events[-3]["meta_info"]["finish_reason"]["type"] == "abort"
    # The streams beside the failures finished whole, with plain greedy decoding's tokens.
    alone = gen(http, n=GOOD_TOKENS)["output_ids"]
    for i in range(2):
        ev = out[f"decode-fault-good-{i}"]
        assert ev[-1] == "[DONE]" and ev[-2]["meta_info"]["finish_reason"]["type"] == "length", ev[-2]
        assert ev[-2]["output_ids"] == alone
    # Same ranks, still serving, every slot free again (failed requests gave theirs back).
    assert rank_pids(base) == pids
    assert http.get("/health").status_code == 200
    # A slot the failures kept would refuse one of these ("no free slot"): gen asserts a 200.
    slots = http.get("/server_info").json()["max_running_requests"]
    replies: dict[int, dict] = {}

    def one(i: int) -> None:
        with httpx.Client(base_url=base, timeout=120) as c:
            replies[i] = gen(c, n=8)
    runs = [threading.Thread(target=one, args=(i,)) for i in range(slots)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(120)
    assert sorted(replies) == list(range(slots)) and all(len(r["output_ids"]) == 8 for r in replies.values())
