"""The backend for our reference engine's server (`specdecode-tune serve`): everything live.

Its /set_internal_state validates all keys of one body as one configuration and answers 200 [true]
once every rank applied it, or 400 {"error": {...}} and changes nothing. Its phase stream gives
per-iteration phase times, comm parts and acceptance. Must not import refengine: HTTP only.
"""

from __future__ import annotations

from typing import Any

from probes.names import DRAFT_TOKENS, ENGINE_KNOBS as ENGINE_KNOBS_KEY, PLACEMENT, STEPS, TOPK
from tuner.backends.base import Capabilities
from tuner.backends.common_info import common_info, internal_state, shown
from tuner.backends.live import LiveBackend
from tuner.core import setting as vocab


class RefEngineBackend(LiveBackend):
    kind = "refengine"

    def normalize_info(self, raw: dict[str, Any]) -> dict[str, Any]:
        info = common_info(self.kind, raw)
        knobs = internal_state(raw).get(ENGINE_KNOBS_KEY)
        if isinstance(knobs, list):
            info[ENGINE_KNOBS_KEY] = [k for k in knobs if isinstance(k, str) and vocab.knob(k) is not None]
        return info

    @property
    def capabilities(self) -> Capabilities:
        no_stream = self.phase_stream is False
        # The knobs the engine says it supports (server_info `specdecode_knobs`); an engine from
        # before it said so supports the four it always had.
        declared = self.info.get(ENGINE_KNOBS_KEY)
        supported = frozenset(declared) if isinstance(declared, list) else frozenset((STEPS, TOPK, DRAFT_TOKENS, PLACEMENT))
        reasons = {"phase_timers": ""}
        reasons.update({k.arg: f"the reference engine has no {k.arg}" for k in vocab.knobs() if k.arg not in supported})
        return Capabilities(
            settable=supported,
            CAN_CAPTURE_TRACE=True, CAN_FETCH_TRACE=True,
            HAS_PHASE_TIMERS=True, HAS_PHASE_STREAM=not no_stream,
            LOCAL_GPUS=self.local_gpus(),
            reasons=reasons,
        )

    def interpret_reply(self, status: int, body: Any) -> tuple[bool, str]:
        if status == 200 and isinstance(body, list) and body and all(x is True for x in body):
            return True, ""
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return False, shown(body["error"].get("message") or body["error"])
        if status == 200:
            return False, "refused by the server"
        return False, f"HTTP {status}" + (f": {shown(body)}" if body is not None else "")
