"""Reading /server_info the same way for every server kind: launch values vs the active configuration.

SGLang (and our engine, which mirrors it) put the launch values at the top level, where they never
change, and the active configuration in `internal_states[i]` (one per DP rank). Only the latter says
what runs now. Secrets are redacted before anything is stored or recorded.
"""

from __future__ import annotations

import re
from typing import Any

from tuner.backends.base import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK
from tuner.core import setting as vocab
from tuner.core.text import terminal_safe

SECRET_HINTS = ("api_key", "apikey", "api-key", "token", "password", "passwd", "secret")
ACTIVE_EXTRA = ("config_epoch", "speculative_algorithm", "speculative_adaptive", "specdecode_num_steps")
# A secret flag inside a command-line string (SGLang's launch_command, a wrapper's argv): the flag,
# abbreviated or not (`--api-key K`, `--api-ke=K`, `--admin-api-key K`, `--hf-token K`), then its value.
_SECRET_FLAG = re.compile(
    r"""(--?[\w-]*(?:api[-_]?k(?:ey?)?|token|passw(?:or)?d|secret)[\w-]*)(=|\s+)("[^"]*"|'[^']*'|\S+)""",
    re.IGNORECASE)
# Server strings shown to people are cut to this many characters.
MAX_SHOWN = 200


def _is_secret_key(k: Any) -> bool:
    low = k.lower() if isinstance(k, str) else ""
    return any(h in low.replace("tokenizer", "") for h in SECRET_HINTS)


def redact_text(text: str) -> str:
    """`text` with the value after any secret-looking flag replaced by ***."""
    return _SECRET_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)


def redact(d: Any, _depth: int = 0) -> Any:
    """A copy of `d` with secrets replaced by ***: values under secret-looking keys, and flag values
    inside strings that look like command lines, at any depth (lists of argv included)."""
    if _depth > 64:
        return "***"
    if isinstance(d, dict):
        return {k: ("***" if v and _is_secret_key(k) and not isinstance(v, (bool, int, float)) else redact(v, _depth + 1))
                for k, v in d.items()}
    if isinstance(d, list):
        out, hide = [], False
        for v in d:
            if hide:
                out.append("***")
                hide = False
                continue
            if isinstance(v, str) and v.startswith("-") and "=" not in v and _SECRET_FLAG.match(v + " x"):
                hide = True          # an argv list: the next element is the secret
            out.append(redact(v, _depth + 1))
        return out
    if isinstance(d, str):
        return redact_text(d)
    return d


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
