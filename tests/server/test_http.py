"""The server over real HTTP on loopback against TP2 CPU ranks: every endpoint, live switches,
concurrency, profiling, the phase stream, bad requests. (Lifecycle tests are in test_lifecycle.py.)"""

from __future__ import annotations

import gzip
import json
import re
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import wait_until
from refengine.server import sse

pytestmark = pytest.mark.slow

# Python source: what the shipped tiny model was trained on, so its drafts get accepted.
PROMPT_IDS = list(b"import os\nimport sys\n\n\ndef main(")
CONFIG_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
               "speculative_draft_placement")


def gen(http, ids=PROMPT_IDS, n=24, **extra):
    r = http.post("/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def set_state(http, **args):
    return http.post("/set_internal_state", json={"server_args": args})


def metric_values(http):
    out = {}
    for fam in text_string_to_metric_families(http.get("/metrics").text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.fixture
def restore(http):
    info = http.get("/server_info").json()["internal_states"][0]
    yield
    r = set_state(http, speculative_num_steps=info["speculative_num_steps"],
                  speculative_draft_placement=info["speculative_draft_placement"])
    assert r.status_code == 200, r.text


def test_health_and_model_info(http):
    assert http.get("/health").status_code == 200
    assert http.get("/health_generate").status_code == 200
    for path in ("/model_info", "/get_model_info"):
        info = http.get(path).json()
        assert info["is_generation"] is True and "model_path" in info and info["architectures"]
    assert http.get("/v1/models").json()["data"][0]["id"]


def test_server_info_launch_and_active(http):
    for path in ("/server_info", "/get_server_info"):
        info = http.get(path).json()
        assert info["tp_size"] == 2 and info["speculative_algorithm"] == "EAGLE3"
        assert info["speculative_num_steps"] == 3 and info["speculative_num_draft_tokens"] == 4
        st = info["internal_states"][0]
        for k in (*CONFIG_KEYS, "avg_spec_accept_length", "last_gen_throughput", "emulated_comm",
                  "simulated_accept", "config_epoch"):
            assert k in st, k
        assert st["emulated_comm"] is False and st["simulated_accept"] is False


def test_generate_non_streaming(http):
    r = gen(http, n=16)
    assert len(r["output_ids"]) == 16 and isinstance(r["text"], str)
    m = r["meta_info"]
    assert m["finish_reason"] == {"type": "length", "length": 16}
    assert m["prompt_tokens"] == len(PROMPT_IDS) and m["completion_tokens"] == 16
    assert m["spec_verify_ct"] >= 1 and m["e2e_latency"] > 0
    assert sum(m["spec_correct_drafts_histogram"]) == m["spec_verify_ct"]
    # The agreeing checkpoint accepts drafts, so this cannot pass by rejecting everything.
    assert m["spec_accept_length"] > 1.2


def test_generate_streaming_cumulative(http):
    with http.stream("POST", "/generate", json={"input_ids": PROMPT_IDS, "stream": True, "sampling_params": {
            "max_new_tokens": 20, "temperature": 0, "ignore_eos": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse.parse(r.read())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = [c["output_ids"] for c in chunks]
    assert all(a == b[:len(a)] for a, b in zip(ids, ids[1:])), "chunks must be cumulative"
    assert len(ids[-1]) == 20 and ids[-1] == gen(http, n=20)["output_ids"]
    assert "spec_verify_ct" in chunks[-1]["meta_info"] and "e2e_latency" in chunks[-1]["meta_info"]
    assert all("spec_verify_ct" not in c["meta_info"] for c in chunks[:-1])


def test_text_prompt_and_stop_string(http):
    r = http.post("/generate", json={"text": "    def __init__(self", "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    first = r.json()
    assert len(first["output_ids"]) == 12 and first["text"]
    stop = first["text"][3:5]
    assert len(stop) == 2, first
    r2 = http.post("/generate", json={"text": "    def __init__(self", "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": stop}}).json()
    assert r2["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert r2["text"] == first["text"][: first["text"].index(stop)]


def test_batch_generate(http):
    r = http.post("/generate", json={"input_ids": [PROMPT_IDS, PROMPT_IDS[:4]], "sampling_params": {
        "max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200 and [len(x["output_ids"]) for x in r.json()] == [6, 6]


def test_v1_completions(http):
    r = http.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 10, "temperature": 0,
                                           "ignore_eos": True, "return_spec_tokens_details": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 10
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["sglext"]["spec_tokens_details"]["spec_verify_ct"] >= 1
    with http.stream("POST", "/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 10, "temperature": 0,
                                                      "ignore_eos": True, "stream": True,
                                                      "stream_options": {"include_usage": True}}) as s:
        events = sse.parse(s.read())
    # As SGLang: usage comes last, in a chunk of its own (tests/conformance has the full layout).
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 10
    assert events[-2]["choices"] == []
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == body["choices"][0]["text"]


def test_greedy_identical_across_live_switches(http, restore):
    reference = gen(http, n=32)["output_ids"]
    assert set_state(http, speculative_num_steps=0).json() == [True]
    plain = gen(http, n=32)
    assert plain["output_ids"] == reference, "speculation must not change greedy output"
    launch = http.get("/server_info").json()
    for placement in ("replicated", "rank0", "sharded"):
        for steps in (1, 4):
            r = set_state(http, speculative_num_steps=steps, speculative_draft_placement=placement)
            assert r.status_code == 200 and r.json() == [True], r.text
            info = http.get("/server_info").json()
            st = info["internal_states"][0]
            assert (st["speculative_num_steps"], st["speculative_num_draft_tokens"],
                    st["speculative_draft_placement"]) == (steps, steps + 1, placement)
            # Top-level values are the launch values and never change.
            assert {k: info[k] for k in CONFIG_KEYS} == {k: launch[k] for k in CONFIG_KEYS}
            assert info["speculative_num_steps"] == 3
            mv = metric_values(http)
            assert mv["sglang:spec_num_steps"][0][1] == steps
            assert mv["sglang:spec_num_draft_tokens"][0][1] == steps + 1
            assert {l["placement"]: v for l, v in mv["specdecode:draft_placement"]}[placement] == 1.0
            assert gen(http, n=32)["output_ids"] == reference, (placement, steps)


def test_invalid_knobs_refused_and_nothing_changes(http):
    before = http.get("/server_info").json()["internal_states"][0]
    for args in ({"speculative_num_steps": -1}, {"speculative_draft_placement": "everywhere"},
                 {"speculative_num_steps": 2, "speculative_num_draft_tokens": 7},
                 {"speculative_eagle_topk": 0}, {"pp_max_micro_batch_size": 2},
                 {"speculative_num_steps": "3"}):
        r = set_state(http, **args)
        assert r.status_code == 400, (args, r.text)
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "code"} and err["code"] == 400 and err["message"]
    after = http.get("/server_info").json()["internal_states"][0]
    assert {k: after[k] for k in (*CONFIG_KEYS, "config_epoch")} == \
        {k: before[k] for k in (*CONFIG_KEYS, "config_epoch")}


def test_concurrent_streams_queue_and_finish(http, base):
    """Three streams more than --max-running-requests: all finish, counted by output_ids."""
    slots = http.get("/server_info").json()["max_running_requests"]
    n = slots + 3
    results: dict[int, list] = {}

    def run(i: int) -> None:
        with httpx.Client(base_url=base, timeout=120) as c:
            with c.stream("POST", "/generate", json={"input_ids": PROMPT_IDS[: 3 + i], "stream": True,
                                                     "sampling_params": {"max_new_tokens": 12 + i,
                                                                         "temperature": 0, "ignore_eos": True}}) as r:
                results[i] = sse.parse(r.read())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    seen = {"queue": 0, "running": 0}

    def sample() -> bool:
        mv = metric_values(http)
        seen["queue"] = max(seen["queue"], mv["sglang:num_queue_reqs"][0][1])
        seen["running"] = max(seen["running"], mv["sglang:num_running_reqs"][0][1])
        return not any(t.is_alive() for t in threads)

    wait_until(sample, 240, "every stream to finish", interval=0.02)
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(n))
    assert seen["running"] == slots and seen["queue"] >= 1, seen
    for i, events in results.items():
        assert events[-1] == "[DONE]"
        assert len(events[-2]["output_ids"]) == 12 + i
        # Batched decoding must not change greedy outputs.
        assert events[-2]["output_ids"] == gen(http, ids=PROMPT_IDS[: 3 + i], n=12 + i)["output_ids"]


def test_metrics_surface(http):
    gen(http, n=12)
    mv = metric_values(http)
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_num_steps",
                 "sglang:spec_num_draft_tokens", "sglang:gen_throughput", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:realtime_tokens_total",
                 "sglang:forward_execution_seconds_total", "specdecode:phase_seconds_total",
                 "specdecode:phase_comm_seconds_total", "specdecode:phase_comm_calls_total",
                 "specdecode:accept_position_total", "specdecode:iterations_total",
                 "specdecode:rank_info"):
        assert name in mv, name
    assert {l["mode"] for l, _ in mv["sglang:realtime_tokens_total"]} == {"decode"}
    assert mv["sglang:realtime_tokens_total"][0][1] > 0
    cats = {l["category"] for l, _ in mv["sglang:forward_execution_seconds_total"]}
    assert {"eagle_draft", "eagle_draft_extend", "target_verify"} <= cats
    assert {l["rank"] for l, _ in mv["specdecode:phase_seconds_total"]} == {"0", "1"}
    assert {l["rank"] for l, _ in mv["specdecode:iterations_total"]} == {"0", "1"}
    assert {l["phase"] for l, _ in mv["specdecode:phase_seconds_total"]} >= {"draft", "verify", "draft_extend"}
    ranks = sorted(int(l["tp_rank"]) for l, _ in mv["specdecode:rank_info"])
    assert ranks == [0, 1]
    pos = {int(l["k"]): v for l, v in mv["specdecode:accept_position_total"]}
    assert pos[0] > 0 and pos.get(1, 0) > 0 and all(pos[k] >= pos.get(k + 1, 0) for k in pos)


def test_phase_stream(http):
    first = http.get("/specdecode/phases", params={"after": 0, "limit": 4096}).json()
    gen(http, n=10)
    page = http.get("/specdecode/phases", params={"after": first["next"], "limit": 2}).json()
    assert set(page) == {"next", "dropped", "records"} and len(page["records"]) == 2
    rec = page["records"][0]
    for k in ("seq", "t", "epoch", "steps", "topk", "num_draft_tokens", "placement", "bs", "committed",
              "wall_ms", "phase_ms", "comm_ms", "accepted", "simulated", "emulated_comm"):
        assert k in rec, k
    assert set(rec["phase_ms"]) >= {"draft", "verify", "verify_sample", "draft_extend"}
    assert rec["seq"] > first["next"] and page["next"] >= page["records"][-1]["seq"]
    # A reader still following an earlier server (seq beyond the end) is pointed at the real end.
    beyond = http.get("/specdecode/phases", params={"after": 10**9}).json()
    assert beyond["records"] == [] and page["records"][-1]["seq"] <= beyond["next"] < 10**9
    assert http.get("/specdecode/phases", params={"after": "x"}).status_code == 400
    assert http.get("/specdecode/phases", params={"limit": 0}).status_code == 400


def test_decode_log_line_printed(server, http):
    gen(http, n=30)
    pat = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Decode batch, #running-req: \d+, #token: \d+, "
                     r"token usage: \d+\.\d\d, accept len: \d+\.\d\d, accept rate: \d+\.\d\d, "
                     r"(cpu|cuda) graph: False, gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$")
    assert any(pat.match(line) for line in server.log_text().splitlines()), server.log_text()[-2000:]


def test_profile_both_ranks_spans_and_download(http, tmp_path):
    out = tmp_path / "traces"
    r = http.post("/start_profile", json={"output_dir": str(out), "profile_id": "t1", "with_stack": False,
                                          "record_shapes": False, "activities": ["CPU", "GPU"]})
    assert r.status_code == 200, r.text
    again = http.post("/start_profile", json={"output_dir": str(out), "profile_id": "t2"})
    assert again.status_code == 400 and "profil" in again.json()["error"]["message"]
    gen(http, n=8)
    assert http.post("/stop_profile").status_code == 200
    assert http.post("/stop_profile").status_code == 400  # nothing running now
    names = sorted(p.name for p in out.iterdir())
    assert names == ["t1-TP-0.trace.json.gz", "t1-TP-1.trace.json.gz"]
    listing = {f["name"]: f for f in http.get("/specdecode/traces").json()["files"]}
    for name in names:
        assert listing[name]["profile_id"] == "t1" and listing[name]["size"] == (out / name).stat().st_size
        dl = http.get(f"/specdecode/traces/{name}")
        assert dl.status_code == 200 and dl.content == (out / name).read_bytes()
        trace = json.loads(gzip.decompress(dl.content))
        spans = {e.get("name", "") for e in trace["traceEvents"]}
        assert "draft" in spans and "draft_extend" in spans, name
        assert any(s.startswith("step[VERIFY bs=") for s in spans), name
    assert http.get("/specdecode/traces/..%2F..%2Fetc%2Fpasswd").status_code == 404
    assert http.get("/specdecode/traces/nope-TP-0.trace.json.gz").status_code == 404


def test_profile_num_steps_stops_by_itself(http, tmp_path):
    r = http.post("/start_profile", json={"output_dir": str(tmp_path), "profile_id": "auto",
                                          "num_steps": 2, "with_stack": False})
    assert r.status_code == 200, r.text
    gen(http, n=16)
    wait_until(lambda: len(list(tmp_path.glob("auto-TP-*.trace.json.gz"))) >= 2, 30, "both ranks' traces")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["auto-TP-0.trace.json.gz", "auto-TP-1.trace.json.gz"]


@pytest.mark.parametrize("method, path, kw, status", [
    ("POST", "/generate", {"content": b"{not json"}, 400),
    ("POST", "/generate", {"json": {"text": 5}}, 400),
    ("POST", "/generate", {"json": {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": -4}}}, 400),
    ("POST", "/generate", {"json": {"input_ids": [10**9]}}, 400),
    ("POST", "/generate", {"json": {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 10**7}}}, 400),
    ("POST", "/v1/completions", {"json": {"max_tokens": 3}}, 400),
    ("POST", "/set_internal_state", {"content": b"[]"}, 400),
    ("POST", "/start_profile", {"json": {"num_steps": -1}}, 400),
    ("GET", "/nope", {}, 404),
    ("GET", "/generate", {}, 405),
])
def test_bad_requests_leave_server_healthy(http, method, path, kw, status):
    r = http.request(method, path, **kw)
    assert r.status_code == status, r.text
    body = r.json()
    # SGLang's OpenAI routes answer with a flat ErrorResponse, its other routes nest it under
    # "error"; a path or method no route takes gets Starlette's {"detail": ...}.
    if status in (404, 405):
        assert body == {"detail": "Not Found" if status == 404 else "Method Not Allowed"}
    else:
        assert (body["message"] if path.startswith("/v1/") else body["error"]["message"])
    assert http.get("/health").status_code == 200
    assert len(gen(http, n=4)["output_ids"]) == 4


def test_flush_cache(http, base):
    r = http.post("/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed.")
    # SGLang refuses while requests run. The request is a stream as long as the context allows, and
    # the flush is asked for once its first tokens arrived. A flush that succeeds anyway is legal
    # only if the request had already ended (the recorded stream says so), so the test asks again.
    n = http.get("/server_info").json()["context_length"] - len(PROMPT_IDS) - 16
    refused = None
    for _ in range(3):
        with httpx.Client(base_url=base, timeout=120) as c, c.stream("POST", "/generate", json={
                "input_ids": PROMPT_IDS, "stream": True,
                "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}) as s:
            chunks = s.iter_bytes()
            body = next(chunks)
            reply = http.post("/flush_cache")
            if reply.status_code == 400:
                refused = reply
                break   # leaving the stream disconnects, which aborts the request
            body += b"".join(chunks)
        events = sse.parse(body)
        assert reply.status_code == 200 and events[-1] == "[DONE]" and len(events[-2]["output_ids"]) == n
    assert refused is not None, "the request ended before every flush: the server outran the test"
    assert refused.text.startswith("Cache not flushed.")
    assert http.post("/flush_cache", params={"timeout": 60}).status_code == 200  # ... or waits


def test_client_disconnect_mid_stream_frees_slot(http, base):
    with httpx.Client(base_url=base, timeout=60) as c:
        with c.stream("POST", "/generate", json={"input_ids": PROMPT_IDS, "stream": True, "sampling_params": {
                "max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}) as r:
            next(r.iter_bytes())
    # The aborted request leaves the batch: the server goes idle again.
    def idle() -> bool:
        mv = metric_values(http)
        return mv["sglang:num_running_reqs"][0][1] == 0 and mv["sglang:num_queue_reqs"][0][1] == 0

    wait_until(idle, 30, "the server to go idle after the client left")


def test_chunked_and_oversized_bodies(http):
    payload = json.dumps({"input_ids": PROMPT_IDS, "sampling_params": {
        "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}).encode()

    def chunks():
        yield payload[:10]
        yield payload[10:]

    r = http.post("/generate", content=chunks())
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 3, r.text
    big = http.post("/generate", content=b" " * (17 << 20))
    assert big.status_code == 413 and "too large" in big.json()["error"]["message"]
    assert http.get("/health").status_code == 200


def test_ready_is_200_without_a_body(http):
    """SGLang's GET /ready (http_server.py:714-718): 200 once serving, no body; open without the
    key (utils/auth.py:102-104; test_profiles_auth_sse.py checks the exemption)."""
    r = http.get("/ready")
    assert r.status_code == 200 and r.content == b""


def test_sglang_refusals_and_error_shapes(http):
    """What SGLang refuses, refused the same way: a /generate error is {"error": {"message"}}
    (http_server.py:2246-2250); a field the engine would ignore is a 400 naming it on /generate and
    /v1/completions, as on chat; completions' max_tokens 0 (protocol.py:448-453) and a body not
    declared application/json (http_server.py:695-706) are 400s of type "Bad Request"."""
    r = http.post("/generate", json={"input_ids": PROMPT_IDS, "sampling_params": {"regex": "a+"}})
    assert r.status_code == 400 and r.json() == {
        "error": {"message": "regex is not supported by the reference engine (got 'a+')"}}, r.text
    r = http.post("/generate", json={"input_ids": PROMPT_IDS, "sampling_params": {"min_new_tokens": 4}})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("min_new_tokens is not supported")
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "frequency_penalty": 0.5})
    assert r.status_code == 400 and r.json()["message"].startswith("frequency_penalty is not supported"), r.text
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["message"] == "max_tokens must be positive", r.text
    assert r.json()["type"] == "Bad Request"
    for route, body in (("/v1/completions", b'{"prompt": "x", "max_tokens": 2}'),
                        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}')):
        r = http.post(route, content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 400, r.text
        assert r.json()["message"] == "Unsupported Media Type: Only 'application/json' is allowed"
        assert r.json()["type"] == "Bad Request"
    assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "frequency_penalty": 0}).status_code == 200
