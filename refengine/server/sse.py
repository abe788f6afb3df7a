"""Server-sent-events framing exactly as SGLang streams: `data: <json>\\n\\n`, ending `data: [DONE]\\n\\n`.

Bytes only; it must not know about requests or sockets.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def error_event(message: str, err_type: str = "BadRequestError", code: int = 400) -> bytes:
    return event({"error": {"message": message, "type": err_type, "code": code, "retryable": False}})


def parse(stream: bytes) -> list[Any]:
    """Split an SSE body into its JSON payloads; `[DONE]` is returned as the string "[DONE]"."""
    out: list[Any] = []
    for block in stream.decode().split("\n\n"):
        block = block.strip()
        if not block.startswith("data: "):
            continue
        body = block[len("data: "):]
        out.append(body if body == "[DONE]" else json.loads(body))
    return out
