"""The OpenAI routes of `serve --tp-size 2` against SGLang 0.5.23's rules, row by row.

Each row names the SGLang source it states (`sglang/srt/entrypoints/openai/...` of the 0.5.23
wheel; `http_server.py` is `sglang/srt/entrypoints/http_server.py`). When SGLang is upgraded,
updating these rows is the whole change. The last test drives the server with the `openai` package
itself, 8 requests at once.
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import httpx
import pytest

from refengine.server.app import default_model
from refengine.server.chat_template import load_chat_template
from refengine.server.sse import parse as parse_sse
from refengine.server.tokenizer import load_tokenizer
from tests.conformance.sglang_judge import completion_response, completion_stream_chunk
from tests.server.helpers import MODEL_ARGS, checked_server

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You write short answers."},
            {"role": "user", "content": "The capital city of France is"}]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    with checked_server([*MODEL_ARGS, "--tp-size", "2", "--port", "0", "--max-running-requests", "8"]) as s:
        yield s


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def prompt_ids(server):
    """What SGLang would send the model for a conversation: the model's chat template rendered
    with add_generation_prompt, encoded without added special tokens (serving_chat.py:2180-2200,
    2322-2330)."""
    info = httpx.get(f"{server.url}/model_info", timeout=60).json()
    path = default_model()["model_path"] if info["load_format"] != "dummy" else None
    # The byte-level presets' tokenizer caps at 256 ids; a model directory says its own size.
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"] if path else 256
    tok = load_tokenizer(path, vocab)
    template = load_chat_template(path)
    return lambda messages: tok.encode(template.render(messages, add_generation_prompt=True))


def chat(http, **body):
    return http.post("/v1/chat/completions", json={"messages": MESSAGES, **body})


def stream(http, path, body):
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return parse_sse(r.read())


# ----- /v1/chat/completions, not streamed --------------------------------------------------------

def test_chat_reply_shape(http):
    """serving_chat.py:2832-3050 (_build_chat_response), protocol.py:1293-1351: id from the
    request id with prefix chatcmpl- (:638-639), object chat.completion, one choice whose message
    is the assistant's, finish_reason the finish type, usage as UsageInfo (protocol.py:221-229),
    metadata with the weight version, sglext only when asked."""
    r = chat(http, max_tokens=7, **GREEDY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "metadata"}
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["metadata"] == {"weight_version": "default"}
    (choice,) = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason", "matched_stop"}
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["message"]["reasoning_content"] is None and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "length" and choice["matched_stop"] is None
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens",
                                  "prompt_tokens_details", "reasoning_tokens", "completion_tokens_details"}
    assert body["usage"]["completion_tokens"] == 7
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 7


def test_chat_prompt_is_the_rendered_template(http, prompt_ids):
    """The messages reach the model as the chat template renders them: the reply equals /generate
    on the rendered, encoded prompt (greedy), and prompt_tokens counts exactly those ids."""
    ids = prompt_ids(MESSAGES)
    body = chat(http, max_tokens=12, **GREEDY).json()
    ref = http.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 12, **GREEDY}}).json()
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["choices"][0]["message"]["content"] == ref["text"]


def test_chat_content_parts_are_joined_with_a_space(http, prompt_ids):
    """jinja_template_utils.py:322-335 ("string" content format): text parts joined by " "."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "The capital"},
                                          {"type": "text", "text": "city of France is"}]}]
    joined = [{"role": "user", "content": "The capital city of France is"}]
    a = http.post("/v1/chat/completions", json={"messages": parts, "max_tokens": 5, **GREEDY}).json()
    assert a["usage"]["prompt_tokens"] == len(prompt_ids(joined))
    b = http.post("/v1/chat/completions", json={"messages": joined, "max_tokens": 5, **GREEDY}).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_chat_sglext_when_asked(http):
    """serving_chat.py:2864-2897: response-level sglext.spec_tokens_details (SpecTokensDetails,
    protocol.py:456-467, every field) only with return_spec_tokens_details."""
    body = chat(http, max_tokens=9, return_spec_tokens_details=True, **GREEDY).json()
    d = body["sglext"]["spec_tokens_details"]
    assert list(d) == ["spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
                       "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                       "spec_correct_drafts_histogram", "spec_cap_lens_histogram"]
    assert d["spec_verify_ct"] >= 1
    assert "sglext" not in chat(http, max_tokens=2, **GREEDY).json()


def test_completion_reply_shape(http, sglang_src):
    """serving_completions.py:532-647 (_build_completion_response), protocol.py:528-543: usage as
    UsageInfo, metadata with the weight version, sglext with every SpecTokensDetails field; the body
    is exactly what SGLang's CompletionResponse serialises it to. :554-564: a list of details only
    when the request's n > 1, so a batch of prompts with n = 1 gets the first prompt's dict."""
    body = http.post("/v1/completions", json={"prompt": "The capital city of France is", "max_tokens": 6,
                                              **GREEDY, "return_spec_tokens_details": True}).json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "metadata", "sglext"}
    assert body == completion_response(sglang_src, body)
    assert body["metadata"] == {"weight_version": "default"}
    assert body["usage"]["completion_tokens"] == 6 and body["usage"]["reasoning_tokens"] == 0
    assert body["usage"]["prompt_tokens_details"] is None
    assert len(body["sglext"]["spec_tokens_details"]) == 9
    first = http.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3, **GREEDY,
                                               "return_spec_tokens_details": True}).json()
    both = http.post("/v1/completions", json={"prompt": ["a b c", "d e f"], "max_tokens": 3, **GREEDY,
                                              "return_spec_tokens_details": True}).json()
    assert both == completion_response(sglang_src, both)
    assert both["sglext"]["spec_tokens_details"] == first["sglext"]["spec_tokens_details"]
    assert "sglext" not in http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()


# ----- streamed ----------------------------------------------------------------------------------

def test_chat_stream_layout(http):
    """serving_chat.py:2582-2597 role chunk first (content ""), :1032-1050 one chunk per text delta,
    :2641-2662 a chunk with only finish_reason, then :2756-2764 sglext and :2766-2791 usage each in a
    chunk of its own with `choices: []`, then [DONE]. sse_utils.py:13-46: delta always carries
    reasoning_content; role and content only when set."""
    events = stream(http, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 10, **GREEDY,
                                                   "stream_options": {"include_usage": True},
                                                   "return_spec_tokens_details": True})
    assert events[-1] == "[DONE]"
    role, *content, finish, ext, usage, _ = events
    assert {e["object"] for e in events[:-1]} == {"chat.completion.chunk"}
    assert len({e["id"] for e in events[:-1]}) == 1 and events[0]["id"].startswith("chatcmpl-")
    assert role["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert all(set(c["choices"][0]["delta"]) == {"reasoning_content", "content"} and c["choices"][0]["delta"]["content"]
               and c["choices"][0]["finish_reason"] is None for c in content)
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "length" and finish["choices"][0]["matched_stop"] is None
    assert ext["choices"] == [] and ext["usage"] is None and ext["sglext"]["spec_tokens_details"]["spec_verify_ct"] >= 1
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10 and "sglext" not in usage
    whole = chat(http, max_tokens=10, **GREEDY).json()["choices"][0]["message"]["content"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == whole


def test_chat_stream_without_usage_or_sglext(http):
    """utils.py:250-264: usage only with stream_options.include_usage (the server default is off);
    sglext only when asked. The finish chunk is then the last before [DONE]."""
    events = stream(http, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, **GREEDY})
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e and "sglext" not in e for e in events[:-1])


def test_completions_stream_tail_chunks(http, sglang_src):
    """serving_completions.py:340-403 the finish reason rides on the last choice chunk, written by
    CompletionStreamResponse.model_dump_json(): `usage: null`, no sglext (protocol.py:568-582);
    :454-475 sglext in its own chunk (choices [], usage null); :477-496 usage in its own chunk,
    serialized with exclude_none. Every chunk is what SGLang's model serialises it to."""
    events = stream(http, "/v1/completions", {"prompt": "The capital city of France is", "max_tokens": 8,
                                              **GREEDY, "stream_options": {"include_usage": True},
                                              "return_spec_tokens_details": True})
    *choices, ext, usage, done = events
    assert done == "[DONE]"
    assert choices[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None and "sglext" not in c for c in choices)
    assert all(c == completion_stream_chunk(sglang_src, c) for c in [*choices, ext])
    assert usage == completion_stream_chunk(sglang_src, usage, exclude_none=True)
    assert ext["choices"] == [] and ext["usage"] is None and ext["sglext"]["spec_tokens_details"]["spec_verify_ct"] >= 1
    assert usage["choices"] == [] and "sglext" not in usage
    assert usage["usage"] == {"prompt_tokens": usage["usage"]["prompt_tokens"], "total_tokens": usage["usage"]["total_tokens"],
                              "completion_tokens": 8, "reasoning_tokens": 0}
    plain = stream(http, "/v1/completions", {"prompt": "The capital city of France is", "max_tokens": 3, **GREEDY})
    assert plain[-2]["choices"][0]["finish_reason"] == "length" and plain[-2]["usage"] is None


# ----- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    # SGLang serves these (protocol.py:909-1060); the reference engine cannot, so it says which.
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "required"),
    ("response_format", {"type": "json_object"}),
    ("n", 2),
    ("logprobs", True),
    ("top_logprobs", 3),
    ("frequency_penalty", 0.5),
    ("presence_penalty", 0.5),
    ("logit_bias", {"1": 5}),
    ("regex", "a+"),
])
def test_unsupported_fields_are_400_naming_the_field(http, field, value):
    """Refused, never dropped; the body is SGLang's flat ErrorResponse (protocol.py:106-111,
    serving_base.py:205-221)."""
    r = chat(http, max_tokens=2, **{field: value})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["object"] == "error" and body["code"] == 400 and body["type"] == "BadRequestError"
    assert body["message"].startswith(f"{field} is not supported")


@pytest.mark.parametrize("field, value", [("tools", []), ("tool_choice", "none"), ("response_format", {"type": "text"}),
                                          ("n", 1), ("logprobs", False), ("frequency_penalty", 0)])
def test_default_values_of_those_fields_are_accepted(http, field, value):
    assert chat(http, max_tokens=2, **{field: value}).status_code == 200


@pytest.mark.parametrize("messages, message", [
    ([], "Messages cannot be empty."),                                    # serving_chat.py:1105-1106
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "image_url"),
    ([{"content": "no role"}], "messages[0].role"),
    ("hello", "messages: expected a list"),
])
def test_bad_messages(http, messages, message):
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 400 and message in r.json()["message"], r.text


def test_request_supplied_template_is_refused(http):
    """serving_chat.py:1108-1116: chat_template_kwargs may not carry a template."""
    r = chat(http, max_tokens=2, chat_template_kwargs={"chat_template": "{{ 1 }}"})
    assert r.status_code == 400 and "chat_template" in r.json()["message"]


# ----- /v1/models ------------------------------------------------------------------------------

def test_models_shape(http):
    """http_server.py:1993-2022 with ModelCard (protocol.py:87-102): owned_by sglang, root = the
    served name, parent null, max_model_len = the context length; :2025-2050 one model by name, and
    its 404 body."""
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert set(card) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len"}
    assert card["object"] == "model" and card["owned_by"] == "sglang" and card["root"] == card["id"]
    assert card["parent"] is None
    assert card["max_model_len"] == http.get("/server_info").json()["context_length"]
    assert http.get(f"/v1/models/{card['id']}").json() == card
    r = http.get("/v1/models/no-such-model")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


# ----- the real client -------------------------------------------------------------------------

def test_openai_client_eight_at_once(server, http):
    """The `openai` package, unchanged: completions and chat, streamed and not, 8 requests in
    flight at once; every request ends with exactly max_tokens tokens, and each streamed text
    equals the same request's unstreamed text (greedy)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=300, max_retries=0)
    model = client.models.list().data[0].id
    extra = {"ignore_eos": True}

    def one(i: int, streamed: bool | None = None) -> tuple[str, int, str]:
        n = 6 + i
        kind = ("completion", "chat")[i % 2]
        streamed = i % 4 >= 2 if streamed is None else streamed
        if kind == "completion":
            args = dict(model=model, prompt=f"Request {i}: the capital city of France is", max_tokens=n,
                        temperature=0, extra_body=extra)
            if not streamed:
                r = client.completions.create(**args)
                return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason
            text, usage, finish = "", None, None
            for c in client.completions.create(**args, stream=True, stream_options={"include_usage": True}):
                if c.choices:
                    text += c.choices[0].text
                    finish = c.choices[0].finish_reason or finish
                if c.usage:
                    usage = c.usage.completion_tokens
            return text, usage, finish
        args = dict(model=model, messages=[{"role": "user", "content": f"Request {i}: say something"}],
                    max_tokens=n, temperature=0, extra_body=extra)
        if not streamed:
            r = client.chat.completions.create(**args)
            return r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason
        text, usage, finish = "", None, None
        for c in client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}):
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
            if c.usage:
                usage = c.usage.completion_tokens
        return text, usage, finish

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert [(u, f) for _, u, f in results] == [(6 + i, "length") for i in range(8)]
    # Each streamed request (i % 4 in 2, 3) again, unstreamed: the same text.
    for i in (2, 3, 6, 7):
        assert results[i][0] == one(i, streamed=False)[0]
    with pytest.raises(openai.BadRequestError, match="tools is not supported"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
