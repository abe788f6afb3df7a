"""Backends: one object per server kind (our engine, SGLang, a recording) with declared capabilities.

Everything goes over HTTP (or the recording file); never imports torch, refengine or textual.
`connect(url)` reads /server_info once and returns the backend for what answers.
"""

from __future__ import annotations

from probes.names import PLACEMENT
from tuner.backends.base import Backend, Capabilities, ControlResult
from tuner.backends.http import BadAnswer, ServerError, ServerUnreachable

__all__ = ["connect", "detect_kind", "Backend", "Capabilities", "ControlResult", "ServerError",
           "ServerUnreachable", "BadAnswer"]


def detect_kind(server_info: dict, metric_names: list[str] | None = None) -> str | None:
    """"refengine", "sglang" or None, from a /server_info body (and /metrics names if read)."""
    if server_info.get("engine") == "refengine":
        return "refengine"
    states = server_info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    if metric_names and any(n.startswith("specdecode:") for n in metric_names) and \
            PLACEMENT in first:
        return "refengine"
    if "internal_states" in server_info and "version" in server_info:
        return "sglang"
    return None


def connect(url: str, api_key: str | None = None, timeout: float = 3.0, kind: str | None = None) -> Backend:
    """The backend for the server at `url`. Raises ServerError (one line) when none can be used.

    Reads /server_info and /metrics once each (every read is bounded by its deadline), so a slow
    server costs connect() at most two deadlines. `kind` ("sglang" or "refengine") skips the
    detection: `launch --server-kind sglang` drives `serve` with SGLang's live controls only.
    """
    from tuner.backends.promtext import MetricsParseError, parse_metrics
    from tuner.backends.refengine import RefEngineBackend
    from tuner.backends.sglang import SGLangBackend

    probe = RefEngineBackend(url, api_key, timeout=timeout)
    metrics_text: str | None = None
    try:
        try:
            info = probe._http["info"].get_json("/server_info")
        except BadAnswer as e:
            if e.status == 404:
                raise BadAnswer(f"{url} has no /server_info: not SGLang 0.5.x or specdecode-tune serve",
                                404) from None
            raise
        if not isinstance(info, dict):
            raise BadAnswer("GET /server_info: not a JSON object")
        kind = kind or detect_kind(info)
        if kind is None:
            try:
                metrics_text = probe.read_metrics_text()
                names = parse_metrics(metrics_text).names()
            except (ServerError, MetricsParseError):
                names = []
            kind = detect_kind(info, names)
        if kind is None:
            raise BadAnswer(f"{url}/server_info does not look like SGLang or specdecode-tune serve "
                            "(no internal_states/version)")
    finally:
        probe.stop()
    backend: Backend = (RefEngineBackend if kind == "refengine" else SGLangBackend)(url, api_key, timeout=timeout)
    try:
        backend.probe(info, metrics_text)          # type: ignore[attr-defined]
        if isinstance(backend, SGLangBackend):
            backend.check_plugin()
    except BaseException:
        backend.stop()
        raise
    return backend
