"""Reading /server_info the same way for every server kind: launch values vs the active configuration.

SGLang (and our engine, which mirrors it) put the launch values at the top level, where they never
change, and the active configuration in `internal_states[i]` (one per DP rank). Only the latter says
what runs now. Secrets are redacted (tuner.core.redact) before anything is stored or recorded.
"""

from __future__ import annotations

from typing import Any

from tuner.backends.base import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK
from tuner.core import setting as vocab
from tuner.core.redact import redact, redact_text
from tuner.core.text import terminal_safe

ACTIVE_EXTRA = ("config_epoch", "speculative_algorithm", "speculative_adaptive", "specdecode_num_steps")
# Server strings shown to people are cut to this many characters.
MAX_SHOWN = 200


def shown(x: Any, limit: int = MAX_SHOWN) -> str:
    """A server value as a short, terminal-safe string (server strings are data)."""
    s = terminal_safe((x if isinstance(x, str) else str(x))[: limit * 4])
    return s if len(s) <= limit else s[: limit - 1] + "…"


def launch_args(raw: dict[str, Any]) -> dict[str, Any]:
    """The top-level launch values (never the active ones), secrets redacted."""
    return redact({k: v for k, v in raw.items() if k != "internal_states"})


def internal_state(raw: dict[str, Any]) -> dict[str, Any]:
    states = raw.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return states[0]
    return {}


def active_knobs(raw: dict[str, Any]) -> dict[str, Any]:
    """The active knobs from internal_states[0]; a knob the server does not report is absent, and a
    value of a type no knob has (a list, an object) reads as absent too. Strings are made terminal-safe."""
    st = internal_state(raw)
    out: dict[str, Any] = {}
    for k in (*vocab.args(), *ACTIVE_EXTRA):
        v = st.get(k)
        if isinstance(v, str):
            out[k] = shown(v, 64)
        elif v is None or isinstance(v, (bool, int, float)):
            if k in st:
                out[k] = v
    return out


def common_info(kind: str, raw: dict[str, Any]) -> dict[str, Any]:
    st = internal_state(raw)
    return {
        "kind": kind,
        "version": shown(raw.get("version", "?"), 64),
        "model": shown(raw.get("served_model_name") or raw.get("model_path") or "?"),
        "model_path": shown(raw["model_path"]) if isinstance(raw.get("model_path"), str) else None,
        "tp_size": _count(raw.get("tp_size")),
        "dp_size": _count(raw.get("dp_size")),
        "speculative_algorithm": shown(raw["speculative_algorithm"], 32)
        if isinstance(raw.get("speculative_algorithm"), str) else None,
        "startup_time": raw.get("startup_time", st.get("startup_time")),
        "emulated_comm": bool(st.get("emulated_comm", False)),
        "simulated_accept": bool(st.get("simulated_accept", False)),
        "launch": launch_args(raw),
        "active": active_knobs(raw),
    }


def _count(x: Any) -> int | None:
    """A size the server reports (tp_size, dp_size): a sane positive int, else None (unknown)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65536 else None


__all__ = ["common_info", "redact_text", "shown", "launch_args", "active_knobs", "internal_state", "redact",
           "STEPS", "TOPK", "DRAFT_TOKENS", "PLACEMENT"]
