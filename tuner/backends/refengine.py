"""The backend for our reference engine's server (`specdecode-tune serve`): everything live.

Its /set_internal_state validates all keys of one body as one configuration and answers 200 [true]
once every rank applied it, or 400 {"error": {...}} and changes nothing. Its phase stream gives
per-iteration phase times, comm parts and acceptance. Must not import refengine: HTTP only.
"""

from __future__ import annotations

from typing import Any

from tuner.backends.base import Capabilities
from tuner.backends.common_info import common_info, shown
from tuner.backends.live import LiveBackend


class RefEngineBackend(LiveBackend):
    kind = "refengine"

    def normalize_info(self, raw: dict[str, Any]) -> dict[str, Any]:
        return common_info(self.kind, raw)

    @property
    def capabilities(self) -> Capabilities:
        no_stream = self.phase_stream is False
        return Capabilities(
            CAN_SET_STEPS=True, CAN_SET_TOPK=True, CAN_SET_DRAFT_TOKENS=True, CAN_SET_PLACEMENT=True,
            CAN_CAPTURE_TRACE=True, CAN_FETCH_TRACE=True,
            HAS_PHASE_TIMERS=True, HAS_PHASE_STREAM=not no_stream,
            LOCAL_GPUS=self.local_gpus(),
            reasons={"phase_timers": ""},
        )

    def interpret_reply(self, status: int, body: Any) -> tuple[bool, str]:
        if status == 200 and isinstance(body, list) and body and all(x is True for x in body):
            return True, ""
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return False, shown(body["error"].get("message") or body["error"])
        if status == 200:
            return False, "refused by the server"
        return False, f"HTTP {status}" + (f": {shown(body)}" if body is not None else "")
