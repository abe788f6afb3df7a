"""Reading /server_info the same way for every server kind: launch values vs the active configuration.

SGLang (and our engine, which mirrors it) put the launch values at the top level, where they never
change, and the active configuration in `internal_states[i]` (one per DP rank). Only the latter says
what runs now. Secrets are redacted before anything is stored or recorded.
"""

from __future__ import annotations

from typing import Any

from tuner.backends.base import DRAFT_TOKENS, KNOBS, PLACEMENT, STEPS, TOPK

SECRET_HINTS = ("api_key", "token", "password", "secret")
ACTIVE_EXTRA = ("config_epoch", "speculative_algorithm", "speculative_adaptive", "specdecode_num_steps")


def redact(d: dict[str, Any]) -> dict[str, Any]:
    return {k: ("***" if v and any(h in k.lower() for h in SECRET_HINTS) and isinstance(v, str) else v)
            for k, v in d.items()}


def launch_args(raw: dict[str, Any]) -> dict[str, Any]:
    """The top-level launch values (never the active ones), secrets redacted."""
    return redact({k: v for k, v in raw.items() if k != "internal_states"})


def internal_state(raw: dict[str, Any]) -> dict[str, Any]:
    states = raw.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return states[0]
    return {}


def active_knobs(raw: dict[str, Any]) -> dict[str, Any]:
    """The active knobs from internal_states[0]; a knob the server does not report is absent."""
    st = internal_state(raw)
    return {k: st[k] for k in (*KNOBS, *ACTIVE_EXTRA) if k in st}


def common_info(kind: str, raw: dict[str, Any]) -> dict[str, Any]:
    st = internal_state(raw)
    return {
        "kind": kind,
        "version": str(raw.get("version", "?")),
        "model": raw.get("served_model_name") or raw.get("model_path") or "?",
        "model_path": raw.get("model_path"),
        "tp_size": raw.get("tp_size"),
        "dp_size": raw.get("dp_size"),
        "speculative_algorithm": raw.get("speculative_algorithm"),
        "startup_time": raw.get("startup_time", st.get("startup_time")),
        "emulated_comm": bool(st.get("emulated_comm", False)),
        "simulated_accept": bool(st.get("simulated_accept", False)),
        "launch": launch_args(raw),
        "active": active_knobs(raw),
    }


__all__ = ["common_info", "launch_args", "active_knobs", "internal_state", "redact",
           "STEPS", "TOPK", "DRAFT_TOKENS", "PLACEMENT"]
