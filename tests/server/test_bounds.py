"""No request can take the server down: every integer that reaches a rank's tensors is bounded at
parse time (a 400 naming the field), and a property test sends random values of every sampling
field through each generate route of the session's real `serve --tp-size 2`: the server stays up,
and every reply is a 200 or a 400 that names a field it was sent.

The property test is sized for CI (a fixed, derandomized set of examples, one-token generations);
benchmarks/request_fuzz.py runs the same property for longer."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refengine.server.chat import parse_chat
from refengine.server.inputs import BadRequest, parse_completion, parse_generate, parse_json

HUGE = [2**63, 2**64, 10**30, -(2**63) - 1, -(2**70)]


@pytest.mark.parametrize("field", ["top_k", "max_new_tokens", "sampling_seed"])
@pytest.mark.parametrize("value", HUGE)
def test_generate_refuses_integers_no_tensor_holds(field, value):
    with pytest.raises(BadRequest, match=field) as e:
        parse_generate({"text": "hi", "sampling_params": {field: value}})
    assert len(str(e.value)) < 200, "the value came back whole"


@pytest.mark.parametrize("value", [[2**63], [1, -(2**63) - 1], [10**40]])
def test_stop_token_ids_are_bounded(value):
    with pytest.raises(BadRequest, match="stop_token_ids"):
        parse_generate({"text": "hi", "sampling_params": {"stop_token_ids": value}})
    with pytest.raises(BadRequest, match="stop_token_ids"):
        parse_completion({"prompt": "hi", "stop_token_ids": value})


@pytest.mark.parametrize("field", ["top_k", "max_tokens", "seed"])
def test_openai_routes_refuse_huge_integers(field):
    with pytest.raises(BadRequest, match=field):
        parse_completion({"prompt": "hi", field: 2**63})
    with pytest.raises(BadRequest, match=field):
        parse_chat({"messages": [{"role": "user", "content": "hi"}], field: 2**63})


def test_top_k_at_its_bound_is_taken():
    assert parse_generate({"text": "hi", "sampling_params": {"top_k": 2**31 - 1}}).items[0].sampling.top_k == 2**31 - 1


def test_integer_past_the_digit_limit_is_a_400():
    """The red team's N9: json.loads raised ValueError (4300 digits), a 500 with a traceback."""
    with pytest.raises(BadRequest, match="malformed JSON body"):
        parse_json(b'{"server_args": {"speculative_num_steps": ' + b"9" * 4301 + b"}}")


def test_huge_top_k_over_http_is_a_400_and_the_server_lives(http):
    """The red team's N1 reproduction: this body ended every rank and the server."""
    r = http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4,
                                                                       "top_k": 9223372036854775808}})
    assert r.status_code == 400 and "top_k" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "top_k": 10**30})
    assert r.status_code == 400 and "top_k" in r.json()["message"]
    assert http.get("/health").status_code == 200
    assert http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200


# ----- the property test through every route ---------------------------------------------------

# Per route: the name each sampling field has there.
ROUTE_FIELDS = {
    "/generate": ["max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "sampling_seed",
                  "ignore_eos", "stop"],
    "/v1/completions": ["max_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "seed", "ignore_eos",
                        "stop", "n", "stream"],
    "/v1/chat/completions": ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                             "stop_token_ids", "seed", "ignore_eos", "stop", "n", "stream"],
}
# Huge, negative, float where int, NaN and infinities (json.dumps writes them as NaN/Infinity,
# which Python's json reads), strings, lists of each, and a few good values.
VALUES = [*HUGE, -1, 0, 1, 2, 2**31 - 1, 2**31, 1.5, -0.5, 1e-320, 1e308, -1e308, float("nan"), float("inf"),
          float("-inf"), "1", "", "abc", None, True, False, [], {}, [2**63], [-1], [1.5], ["x"], [None],
          [0, 2**64], {"a": 1}, "\x00", "é" * 3]
# Values each field takes (drawn as often as all of VALUES), so that many replies are 200s with
# extreme but valid parameters (temperature 1e308, top_k at its bound, top_p 1e-300, seed 2^63-1).
GOOD = {"max_new_tokens": [0, 1, 2], "max_tokens": [1, 2], "max_completion_tokens": [1, 2],
        "temperature": [0, 0.7, 1.0, 1e-320, 1e308], "top_p": [0.5, 1.0, 1e-300],
        "top_k": [-1, 0, 1, 5, 2**31 - 1], "stop_token_ids": [[], [2], [-1], [2**63 - 1]],
        "sampling_seed": [0, 7, 2**63 - 1], "seed": [0, 7, 2**63 - 1], "ignore_eos": [True, False],
        "stop": ["x", ["a", "b"]], "n": [1], "stream": [False, True]}
# A generation of more than this many tokens would make the test slow: the route's max stays small.
SMALL_MAX = 2


def _body(route: str, fields: dict) -> dict:
    if route == "/generate":
        sp = {"max_new_tokens": 1, **fields}
        return {"text": "hi", "sampling_params": sp}
    body = {"max_tokens": 1, **fields}
    if route == "/v1/chat/completions":
        # No max_tokens (or 0) runs to the context length: keep the generation short.
        for name in ("max_tokens", "max_completion_tokens"):
            if body.get(name) in (None, 0, False):
                body[name] = 1
        return {"messages": [{"role": "user", "content": "hi"}], **body}
    return {"prompt": "hi", **body}


def _short_enough(fields: dict) -> bool:
    """Good values of the max fields that would generate long replies are left out (they are 400s
    past the context length or slow 200s; neither tests the bounds)."""
    for name in ("max_new_tokens", "max_tokens", "max_completion_tokens"):
        v = fields.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and SMALL_MAX < v < 2**40:
            return False
    return True


def _field_named(message: str, sent: dict) -> bool:
    if any(name in message for name in sent):
        return True
    # The context check names max_new_tokens on every route (the OpenAI routes' max_tokens).
    return "max_new_tokens" in message and any(n.startswith("max_") for n in sent)


@st.composite
def _requests(draw):
    route = draw(st.sampled_from(sorted(ROUTE_FIELDS)))
    names = draw(st.lists(st.sampled_from(ROUTE_FIELDS[route]), min_size=1, max_size=3, unique=True))
    fields = {n: draw(st.one_of(st.sampled_from(VALUES), st.sampled_from(GOOD[n]))) for n in names}
    if not _short_enough(fields):
        fields = {n: v for n, v in fields.items() if not n.startswith("max_")} or {"top_k": -1}
    return route, fields


def _check_reply(http: httpx.Client, route: str, fields: dict) -> None:
    raw = json.dumps(_body(route, fields))
    r = http.post(route, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 400), f"{route} {raw[:300]} -> {r.status_code} {r.text[:300]}"
    if r.status_code == 400:
        body = r.json()
        msg = body["message"] if route != "/generate" else body["error"]["message"]
        assert _field_named(msg, fields), f"{route} {raw[:300]} -> 400 naming no field sent: {msg}"
        assert "\n" not in msg and len(msg) < 400, msg


@pytest.mark.slow
def test_fuzz_sampling_fields_through_every_route(tp2_server):
    """300 requests, a derandomized set: each is 200 or a 400 naming a field, and the server
    (ranks included) is healthy after every one of them."""
    with httpx.Client(base_url=tp2_server.url, timeout=60) as http:
        @settings(max_examples=300, derandomize=True, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(_requests())
        def run(req):
            route, fields = req
            _check_reply(http, route, fields)
            assert http.get("/health").status_code == 200, f"unhealthy after {route} {fields}"

        run()
        assert http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
        slots = http.get("/specdecode/slots").json()
        assert slots["engine_requests"] == 0 or slots["problems"] == [], slots


# ----- cheap checks before expensive work (the red team's N4) -----------------------------------

def test_tokenizer_lower_bound_never_exceeds_the_count():
    from refengine.server.tokenizer import ByteTokenizer

    t = ByteTokenizer(256)
    for text in ["", "a", "héllo", "👩‍👩‍👧", "x" * 1000]:
        assert t.fewest_tokens(text) <= len(t.encode(text))


def test_ten_megabyte_prompts_are_refused_before_tokenizing_and_never_stall_metrics(base):
    """Three 10 MB prompts at once (completions, generate, chat): each is a 400 counted without
    the tokenizer ("at least"), and /metrics and /health answer meanwhile. Before, each prompt was
    tokenized first (12 s of CPU) and /metrics stalled 23 s behind three of them."""
    import threading
    import time

    text = "a" * (10 << 20)
    bodies = [("/v1/completions", {"prompt": text, "max_tokens": 1}),
              ("/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1})]
    replies: dict[str, httpx.Response] = {}

    def post(route: str, body: dict) -> None:
        with httpx.Client(base_url=base, timeout=120) as c:
            replies[route] = c.post(route, content=json.dumps(body), headers={"Content-Type": "application/json"})

    threads = [threading.Thread(target=post, args=rb) for rb in bodies]
    for t in threads:
        t.start()
    slowest = 0.0
    with httpx.Client(base_url=base, timeout=120) as c:
        while any(t.is_alive() for t in threads):
            for path in ("/metrics", "/health"):
                t0 = time.monotonic()
                assert c.get(path).status_code == 200
                slowest = max(slowest, time.monotonic() - t0)
    for t in threads:
        t.join()
    for route, r in replies.items():
        assert r.status_code == 400, (route, r.text[:200])
        assert "at least" in r.text and "exceeds the context length" in r.text, (route, r.text[:200])
    # Generous for a busy 2-core host: the defect was 23 s.
    assert slowest < 5.0, f"/metrics or /health took {slowest:.1f} s while the prompts were parsed"
