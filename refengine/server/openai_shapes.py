"""The OpenAI-compatible reply and chunk shapes exactly as SGLang 0.5.23 serializes them.

Chat replies and chunks, the response-level `sglext` and `usage` chunks of both streamed routes,
`usage` itself and the model list. Every shape names the SGLang source it copies
(`sglang/srt/entrypoints/openai/...`). Pure dict building over a finished or partial RequestOutput:
must not run generations or write to sockets.
"""

from __future__ import annotations

import time
from typing import Any

from refengine.server.outputs import RequestOutput

# protocol.py:456-467 SpecTokensDetails, in field order; utils.py:310-340 fills it from meta_info.
SPEC_DETAIL_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("spec_accept_rate", 0.0), ("spec_accept_length", 0.0), ("spec_cap_length", 0.0),
    ("spec_block_accept_length", 0.0), ("spec_num_correct_drafts", 0), ("spec_num_proposed_drafts", 0),
    ("spec_verify_ct", 0), ("spec_correct_drafts_histogram", []), ("spec_cap_lens_histogram", []),
)


def spec_tokens_details(out: RequestOutput) -> dict[str, Any] | None:
    """SpecTokensDetails from the request's final meta_info; None when meta_info has no spec key
    (SGLang then leaves `sglext` out, utils.py:327-328)."""
    meta = out.meta_info()
    if not any(k in meta for k, _ in SPEC_DETAIL_DEFAULTS):
        return None
    return {k: (meta.get(k) or (list(d) if isinstance(d, list) else d)) for k, d in SPEC_DETAIL_DEFAULTS}


def usage_info(outs: list[RequestOutput]) -> dict[str, Any]:
    """protocol.py:221-229 UsageInfo as model_dump() writes it (null details, reasoning_tokens 0)."""
    prompt = sum(o.prompt_tokens for o in outs)
    completion = sum(len(o.output_ids) for o in outs)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}


def _sglext(outs: list[RequestOutput], wanted: bool, n: int = 1) -> dict[str, Any] | None:
    if not wanted:
        return None
    details = [d for d in (spec_tokens_details(o) for o in outs) if d is not None]
    if not details:
        return None
    # serving_completions.py:554-564, serving_chat.py:2864-2868: a list only when the request's
    # n > 1; with n = 1 (the only n this engine takes) a batch of prompts gets the first detail.
    return {"spec_tokens_details": details if n > 1 else details[0]}


def finish_type(out: RequestOutput) -> str | None:
    return (out.finish_reason or {}).get("type") if out.finished else None


def matched_stop(out: RequestOutput) -> Any:
    return (out.finish_reason or {}).get("matched") if out.finished else None


# ----- /v1/chat/completions -----------------------------------------------------------------------

def chat_reply(rid: str, model: str, out: RequestOutput, details: bool) -> dict[str, Any]:
    """serving_chat.py:2832-3050 _build_chat_response with protocol.py:1293-1351's serializers."""
    reply: dict[str, Any] = {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": out.text or "", "reasoning_content": None},
            "logprobs": None,
            "finish_reason": finish_type(out),
            "matched_stop": matched_stop(out),
        }],
        "usage": usage_info([out]),
        "metadata": {"weight_version": "default"},
    }
    sglext = _sglext([out], details)
    if sglext is not None:
        reply["sglext"] = sglext
    return reply


def _chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any], finish: str | None = None,
                matched: Any = None) -> dict[str, Any]:
    # sse_utils.py:13-99: StreamDelta always carries reasoning_content, role/content only when set.
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                         "finish_reason": finish, "matched_stop": matched}]}


def chat_role_chunk(rid: str, model: str, created: int) -> dict[str, Any]:
    """serving_chat.py:2582-2597: the first chunk names the role, with empty content."""
    return _chat_chunk(rid, model, created, {"role": "assistant", "content": ""})


def chat_content_chunk(rid: str, model: str, created: int, text: str) -> dict[str, Any]:
    """serving_chat.py:1032-1050: one chunk per non-empty text delta."""
    return _chat_chunk(rid, model, created, {"content": text})


def chat_finish_chunk(rid: str, model: str, created: int, out: RequestOutput) -> dict[str, Any]:
    """serving_chat.py:2641-2662: after the content, a chunk with only the finish reason."""
    return _chat_chunk(rid, model, created, {}, finish_type(out), matched_stop(out))


def chat_tail_chunks(rid: str, model: str, created: int, out: RequestOutput, details: bool,
                     include_usage: bool) -> list[dict[str, Any]]:
    """serving_chat.py:2756-2791: `sglext` then `usage`, each in its own chunk with no choices."""
    chunks: list[dict[str, Any]] = []
    sglext = _sglext([out], details)
    if sglext is not None:
        chunks.append({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": None, "sglext": sglext})
    if include_usage:
        chunks.append({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": usage_info([out])})
    return chunks


# ----- /v1/completions (streamed) ----------------------------------------------------------------

def completion_tail_chunks(cid: str, model: str, created: int, out: RequestOutput, details: bool,
                           include_usage: bool) -> list[dict[str, Any]]:
    """serving_completions.py:454-496: `sglext` (model_dump_json, so `usage: null` stays) then
    `usage` (exclude_none=True, so null fields go), each with `choices: []`."""
    chunks: list[dict[str, Any]] = []
    sglext = _sglext([out], details)
    if sglext is not None:
        chunks.append({"id": cid, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": None, "sglext": sglext})
    if include_usage:
        usage = {k: v for k, v in usage_info([out]).items() if v is not None}
        chunks.append({"id": cid, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": usage})
    return chunks


def completion_sglext(outs: list[RequestOutput], details: bool) -> dict[str, Any] | None:
    return _sglext(outs, details)


# ----- /v1/models ----------------------------------------------------------------------------------

def model_card(name: str, created: int, max_model_len: int | None) -> dict[str, Any]:
    """protocol.py:87-96 ModelCard as http_server.py:1993-2022 fills it."""
    return {"id": name, "object": "model", "created": created, "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": max_model_len}


def model_list(name: str, created: int, max_model_len: int | None) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(name, created, max_model_len)]}
