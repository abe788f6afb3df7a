"""Validation of /v1/chat/completions bodies, as SGLang 0.5.23's ChatCompletionRequest reads them.

Turns the untrusted body into normalized messages (the dicts the chat template sees), sampling
parameters and the reply options, or raises BadRequest naming the field. Fields the reference
engine cannot honour are refused with a 400 that names them, never silently dropped (the table
`inputs.UNSUPPORTED`, shared with /generate and /v1/completions). Pure: must not render templates,
tokenize or touch the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refengine.server.inputs import (INT64_MAX, SCHEMA_ERROR, BadRequest, Sampling, parse_sampling, refuse_unsupported,
                                     short_value, stream_options)

# protocol.py:1062-1068 _DEFAULT_SAMPLING_PARAMS, used when a field is absent or null.
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    sampling: Sampling                   # max_new_tokens is 0 when the client set none: see max_tokens
    max_tokens: int | None               # None: up to the context length (the scheduler's clamp)
    stream: bool
    include_usage: bool
    model: str | None
    spec_details: bool
    template_kwargs: dict[str, Any]


def _content(content: Any, where: str) -> str:
    """A message's content as the template sees it: a list of parts becomes its text parts joined
    by one space (jinja_template_utils.py:322-335, the "string" content format)."""
    if content is None:
        return ""  # serving_chat.py:2133-2134
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: expected a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise BadRequest(f"{where}.content[{j}]: expected an object with a type")
        kind = part.get("type")
        if kind in ("text", "input_text"):
            if not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.content[{j}].text: expected a string")
            texts.append(part["text"])
        else:
            raise BadRequest(f"{where}.content[{j}]: content part type {kind!r} is not supported by "
                             "the reference engine (text only)")
    return " ".join(texts)


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise BadRequest("messages: expected a list of messages", err_type=SCHEMA_ERROR)
    if not raw:
        raise BadRequest("Messages cannot be empty.")  # serving_chat.py:1105-1106
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where}: expected an object with role and content")
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise BadRequest(f"{where}.role: expected a string")
        # None-valued keys are dropped before rendering (jinja_template_utils.py:239-241).
        msg = {k: v for k, v in m.items() if v is not None}
        msg["content"] = _content(m.get("content"), where)
        out.append(msg)
    return out


def _max_tokens(body: dict) -> int | None:
    # protocol.py:1214: max_completion_tokens or max_tokens.
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= INT64_MAX:
                raise BadRequest(f"{name}: expected an integer in 0..{INT64_MAX}, got {short_value(v)}")
            if v:
                return v
    return None


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadRequest("expected a JSON object")
    refuse_unsupported(body)
    messages = _messages(body.get("messages"))
    max_tokens = _max_tokens(body)
    sp = {k: body[k] for k in ("temperature", "top_p", "top_k", "ignore_eos", "stop", "stop_token_ids", "seed")
          if body.get(k) is not None}
    sp = {**SAMPLING_DEFAULTS, **sp, "max_new_tokens": max_tokens or 0}
    sampling = parse_sampling(sp, seed_name="seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream: expected true or false, got {short_value(stream)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model: expected a string")
    details = body.get("return_spec_tokens_details", False)
    if not isinstance(details, bool):
        raise BadRequest(f"return_spec_tokens_details: expected true or false, got {short_value(details)}")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs: expected an object")
    if "chat_template" in kwargs:
        # serving_chat.py:1108-1116: a request may not bring its own template (not trusted).
        raise BadRequest("Request-supplied chat_template is not allowed.")
    return ChatRequest(messages=messages, sampling=sampling, max_tokens=max_tokens, stream=stream,
                       include_usage=stream_options(body), model=model, spec_details=details,
                       template_kwargs=dict(kwargs))
