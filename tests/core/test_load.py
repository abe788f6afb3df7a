"""The load driver against the stand-in server's SSE /generate (core_standin.py): constant
concurrency, tokens counted by output_ids (not chunks), prompt files with clear errors."""

from __future__ import annotations


import pytest

from harness import wait_until
from tuner.backends.load import LoadDriver, PromptFileError, load_prompts
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.session import Session


def test_tokens_are_counted_by_output_ids(standin):
    standin.generate_tokens = 6            # chunks carry 1, 3, 4, 6, 7, 9 ids: 9 tokens, 6 chunks
    s = Session()
    drv = LoadDriver(standin.url, s.bus, s.clock, [{"text": "hi"}, {"input_ids": [1, 2]}], concurrency=3,
                     max_new_tokens=9)
    drv.start()
    wait_until(lambda: (s.tick(), drv.requests >= 12 and len(s.store.window(S.LOAD_TOK_PER_S)) >= 2)[-1], 60,
               "12 requests and two tok/s readings", interval=0.02)
    drv.stop()
    s.tick()
    assert drv.errors == 0 and drv.requests >= 12
    assert drv.done_tokens == 9 * drv.requests and drv.tokens >= drv.done_tokens
    assert s.store.last_event(EventKind.LOAD_STARTED).data["concurrency"] == 3
    assert s.store.last_event(EventKind.LOAD_STOPPED).data["tokens"] == drv.tokens
    assert max(s.store.window(S.LOAD_INFLIGHT).v) <= 3
    assert any(v > 0 for v in s.store.window(S.LOAD_TOK_PER_S).v)


@pytest.mark.parametrize("incremental", [True, False])
def test_incremental_streaming_sums_the_chunks(standin, incremental):
    """SGLang with --incremental-streaming-output streams each chunk's new ids only (review N15):
    read as cumulative, 9 tokens would count as 2."""
    standin.generate_tokens, standin.incremental = 6, True
    s = Session()
    drv = LoadDriver(standin.url, s.bus, s.clock, [{"text": "hi"}], concurrency=1, max_new_tokens=9,
                     incremental=incremental)
    drv.start()
    wait_until(lambda: drv.requests >= 3, 60, "three requests", interval=0.02)
    drv.stop()
    assert drv.done_tokens == (9 if incremental else 2) * drv.requests


def test_errors_are_folded_into_one_event(standin):
    standin.mode = "500"
    s = Session()
    drv = LoadDriver(standin.url, s.bus, s.clock, [{"text": "hi"}], concurrency=2)
    drv.start()
    wait_until(lambda: drv.errors >= 4, 60, "four failed requests", interval=0.02)
    drv.stop()
    s.tick()
    errs = s.store.events(EventKind.LOAD_ERROR)
    assert len(errs) == 1 and "HTTP 500" in errs[0].data["error"]


def test_prompt_files(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"text": "a"}\n\n# comment\n"plain string"\n{"input_ids": [1, 2]}\n')
    assert load_prompts(p) == [{"text": "a"}, {"text": "plain string"}, {"input_ids": [1, 2]}]
    p.write_text('{"text": "a"}\n{nope\n')
    with pytest.raises(PromptFileError, match=r"p.jsonl:2: not JSON"):
        load_prompts(p)
    p.write_text('{"prompt": "a"}\n')
    with pytest.raises(PromptFileError, match=r":1: each line needs"):
        load_prompts(p)
    with pytest.raises(PromptFileError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")
    p.write_text("")
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(p)


def test_each_request_is_timed_exactly(standin):
    """A finished request is one load_request event: TTFT, e2e and one gap per later output carrying
    its new tokens (chunks of 1, 3, 4, 6, 7, 9 ids: first output 1 token, then 2, 1, 2, 1, 2)."""
    from tuner.core.latency import RequestTiming
    standin.generate_tokens = 6
    s = Session()
    drv = LoadDriver(standin.url, s.bus, s.clock, [{"text": "hi"}], concurrency=2, max_new_tokens=9)
    drv.start()
    wait_until(lambda: (s.tick(), len(s.store.events(EventKind.LOAD_REQUEST)) >= 4)[-1], 60,
               "four timed requests", interval=0.02)
    drv.stop()
    s.tick()
    timings = [RequestTiming.from_data(e.data) for e in s.store.events(EventKind.LOAD_REQUEST)]
    assert len(timings) == drv.requests and all(r is not None for r in timings)
    for r in timings:
        assert r.tokens == 9 and [n for _, n in r.gaps] == [2, 1, 2, 1, 2]
        assert len(r.itl) == 8                      # one inter-token latency per token after the first
        assert 0 <= r.ttft <= r.e2e and sum(g for g, _ in r.gaps) <= r.e2e - r.ttft + 1e-9
        assert r.wait == 0.0


def test_open_loop_poisson_arrivals(standin):
    """--rate: arrivals come on their own clock, capped at the concurrency in flight; the start event
    says the rate."""
    standin.generate_tokens = 2
    s = Session()
    drv = LoadDriver(standin.url, s.bus, s.clock, [{"text": "hi"}], concurrency=2, max_new_tokens=3,
                     rate=50.0, seed=1)
    drv.start()
    wait_until(lambda: (s.tick(), drv.requests >= 10 and len(s.store.window(S.LOAD_BACKLOG)) >= 1)[-1], 60,
               "ten open-loop requests and a report", interval=0.02)
    drv.stop()
    s.tick()
    assert s.store.last_event(EventKind.LOAD_STARTED).data["rate"] == 50.0
    assert "dropped" in s.store.last_event(EventKind.LOAD_STOPPED).data
    assert max(s.store.window(S.LOAD_INFLIGHT).v) <= 2
    assert len(s.store.events(EventKind.LOAD_REQUEST)) == drv.requests


def test_open_loop_refuses_a_bad_rate():
    s = Session()
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="request rate must be a positive number"):
            LoadDriver("http://127.0.0.1:9", s.bus, s.clock, [{"text": "x"}], concurrency=1, rate=bad)
