"""One line of text per event: the TUI's log, `record`'s progress, `tune`'s output and the report's
tuning table all say an event in these words.

`event_text(kind, data)` is the only place an event becomes prose. Each reader picks which kinds
it shows (the TUI's log leaves the tuner's probes to the tune screen, `record` says only what an
operator away from the screen must know) and how it lays a line out (indent, colour, time); none
words an event itself. Data comes from servers and files: every field is read defensively, a
missing or non-numeric figure reads "n/a", never a traceback.

Must not import textual, nor read the store: plain data in, plain text out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tuner.core import setting as vocab
from tuner.core.events import EventKind as K
from tuner.core.events import TuningKind as TK


@dataclass(frozen=True)
class EventText:
    """The words for one event and its tone: good, info, dim, warn or error."""

    text: str
    tone: str


def event_text(kind: str, data: Mapping[str, Any]) -> EventText | None:
    """The line for an event of `kind` with `data`, or None for kinds no reader shows."""
    say = _TEXTS.get(kind)
    return None if say is None else say(data)


def short_error(error: str, limit: int = 60, keep_path: bool = False) -> str:
    """`cannot connect (...)` from `GET http://host/path: cannot connect (...)`: one line fits.
    keep_path: `/path: ...` instead, where which endpoint failed matters (a degraded server)."""
    head, sep, rest = error.partition(": ")
    if sep and head.split(" ", 1)[0] in ("GET", "POST", "PUT", "DELETE"):
        path = "/" + head.split("://", 1)[-1].split("/", 1)[-1] if "://" in head else head.split(" ", 1)[-1]
        error = f"{path}: {rest}" if keep_path else rest
    return error if len(error) <= limit else error[: limit - 1] + "…"


def setting_words(s: Any) -> str:
    """`steps 3 topk 1 draft 4 sharded` (a setting as events carry it, in either naming)."""
    if not isinstance(s, Mapping):
        return "?" if s is None else str(s)
    return vocab.words(s, sep=" ") if s else vocab.TIER0_WORDS


def _num(x: Any, fmt: str = "{:.1f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _tok_s(mean: Any, sd: Any) -> str:
    """`128.0 ± 5.1 tok/s`; the ± part only when the event carries one."""
    return f"{_num(mean)} ± {_num(sd)} tok/s" if isinstance(sd, (int, float)) else f"{_num(mean)} tok/s"


def _pct(ratio: Any) -> str:
    """`+8.1` from a ratio of 1.081."""
    return _num(ratio - 1 if isinstance(ratio, (int, float)) else None, "{:+.1%}").replace("%", "")


def _changes(changes: Any) -> str:
    if not isinstance(changes, Mapping):
        return "nothing"
    return ", ".join(f"{vocab.word(k)}={v}" for k, v in changes.items()) or "nothing"


def _map(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = d.get(key)
    return v if isinstance(v, Mapping) else {}


def _connected(d: Mapping[str, Any]) -> EventText:
    if d.get("was") == "degraded":
        return EventText("answering in time again", "good")
    away = d.get("after_s")
    away_text = f" after {away:.0f}s away" if isinstance(away, (int, float)) and away > 0 else ""
    return EventText(f"connected to {d.get('url', '?')}{away_text}", "good")


def _trace(d: Mapping[str, Any]) -> EventText:
    files = d.get("files")
    n = len(files) if isinstance(files, (list, tuple)) else 0
    error = d.get("analysis_error")
    where = f" in {d['folder']}" if isinstance(d.get("folder"), str) and d.get("folder") else ""
    if error:
        return EventText(f"trace captured: {n} files ({d.get('trace_id', '')}){where}; not analysed: {error}", "warn")
    return EventText(f"trace captured: {n} files ({d.get('trace_id', '')}){where}", "good")


def _tuning_started(d: Mapping[str, Any]) -> EventText:
    space, probes = d.get("space"), d.get("probes")
    sizes = ""
    if isinstance(space, (list, tuple)) and isinstance(probes, (list, tuple)):
        sizes = f": {len(space)} settings, {len(probes)} probes, budget {_num(d.get('budget_s'), '{:.0f}')} s"
    return EventText(f"tuning from {setting_words(d.get('initial'))}{sizes}", "info")


def _tuning_prediction(d: Mapping[str, Any]) -> EventText | None:
    b = _map(d, "best")
    if not b:
        return None
    return EventText(f"model: best {setting_words(b)} predicted {_tok_s(b.get('tok_s'), b.get('sd'))} "
                     f"(bs {d.get('bs', '?')})", "dim")


def _tuning_applied(d: Mapping[str, Any]) -> EventText:
    gain = d.get("predicted_gain")
    vs = "" if d.get("incumbent") is None else f" vs {setting_words(d.get('incumbent'))}"
    gain_text = f" ({_pct(1 + gain)} %{vs})" if isinstance(gain, (int, float)) else ""
    return EventText(f"applying {setting_words(d.get('setting'))}: predicted "
                     f"{_tok_s(d.get('predicted_tok_s'), d.get('sd'))}{gain_text}; verifying with an interleaved A/B",
                     "info")


def _tuning_verified(d: Mapping[str, Any]) -> EventText:
    verdict = d.get("verdict")
    predicted = d.get("predicted_ratio")
    more = f"; predicted {_pct(predicted)} %" if isinstance(predicted, (int, float)) else ""
    return EventText(f"A/B {setting_words(d.get('setting'))}: {verdict}, {_pct(d.get('ratio'))} % "
                     f"[{_pct(d.get('lo'))}, {_pct(d.get('hi'))}]{more}", "good" if verdict == "better" else "info")


_TEXTS: dict[str, Callable[[Mapping[str, Any]], EventText | None]] = {
    K.CONFIG_CHANGED: lambda d: EventText("now running " + vocab.change_words(_map(d, "old"), _map(d, "new")), "good"),
    K.CONFIG_REQUESTED: lambda d: EventText("asked for " + _changes(d.get("changes")), "dim"),
    K.CONFIG_REFUSED: lambda d: EventText(f"refused {_changes(d.get('changes'))}: {d.get('reason', '?')}", "error"),
    K.CONNECTED: _connected,
    K.DISCONNECTED: lambda d: EventText(f"disconnected: {short_error(str(d.get('error', '?')), 80)}", "error"),
    K.DEGRADED: lambda d: EventText(f"degraded: {short_error(str(d.get('reason', '?')), 80, keep_path=True)}",
                                    "warn"),
    K.POLL_ERROR: lambda d: EventText(f"{d.get('endpoint', '?')}: {d.get('error', '?')}", "warn"),
    K.LOAD_STARTED: lambda d: EventText(
        f"load started: {d['rate']:g} requests/s (Poisson, at most {d.get('concurrency', '?')} in flight)"
        if isinstance(d.get("rate"), (int, float)) else f"load started: {d.get('concurrency', '?')} concurrent",
        "info"),
    K.LATENCY_UNAVAILABLE: lambda d: EventText(f"latency: {d.get('reason', '?')}", "warn"),
    K.LOAD_STOPPED: lambda d: EventText(f"load stopped after {d.get('requests', '?')} requests", "info"),
    K.LOAD_ERROR: lambda d: EventText(f"load: {d.get('error', '?')}", "warn"),
    K.PHASE_GAP: lambda d: EventText(f"phase stream missed {d.get('dropped', '?')} iterations", "warn"),
    K.TRACE_CAPTURED: _trace,
    K.RELAUNCH_STARTED: lambda d: EventText(f"relaunching the server for {_changes(d.get('changes'))}", "info"),
    K.RELAUNCH_READY: lambda d: EventText(f"relaunched with {_changes(d.get('changes'))} in "
                                          f"{_num(d.get('seconds'))} s", "good"),
    K.RELAUNCH_FAILED: lambda d: EventText(f"relaunch with {_changes(d.get('changes'))} failed: "
                                           f"{short_error(str(d.get('error', '?')), 100)}", "error"),
    K.RELAUNCH_ROLLED_BACK: lambda d: EventText("the previous launch command runs again", "warn"),
    K.ADAPTIVE_TIER: lambda d: EventText(f"adaptive: steps {d.get('old_steps', '?')} → {d.get('new_steps', '?')} "
                                         f"(EMA correct drafts {_num(d.get('ema_accept_len'), '{:.2f}')})", "dim"),
    K.NOTE: lambda d: EventText(str(d.get("text", "")), "info"),
    K.RECORDING_GAP: lambda d: EventText(f"recording gap: {d.get('reason', '?')}", "warn"),
    K.SERVER_INFO: lambda d: EventText(f"server: {d.get('kind', '?')} {d.get('version', '')} · {d.get('model', '')}",
                                       "dim"),
    # The tuner's events (tuner.tuning.live emits them).
    TK.STARTED: _tuning_started,
    TK.PROBE: lambda d: EventText(f"measured {setting_words(d.get('setting'))} ({d.get('purpose', '?')}): "
                                  f"{_num(d.get('tok_s'))} tok/s over {d.get('n', '?')} iterations", "dim"),
    TK.PREDICTION: _tuning_prediction,
    TK.APPLIED: _tuning_applied,
    TK.VERIFIED: _tuning_verified,
    TK.ROLLED_BACK: lambda d: EventText(f"rolled back {setting_words(d.get('setting'))} to "
                                        f"{setting_words(d.get('to'))}: {d.get('reason', '')}", "warn"),
    TK.REFUSED: lambda d: EventText(f"the server refused {setting_words(d.get('setting'))}: "
                                    f"{d.get('reason', '')}", "warn"),
    TK.PROBLEM: lambda d: EventText(f"tuning problem: {d.get('message', '?')}", "warn"),
    TK.FINISHED: lambda d: _tuning_finished(d),
}


def _tuning_finished(d: Mapping[str, Any]) -> EventText:
    # The one wording of a tuning's outcome (the tune screen and `tune` print it too); a plain-text
    # function of the result's JSON, imported here so the log cannot word it differently.
    from tuner.tuning.summary import result_line

    try:
        return EventText("tuning done: " + result_line(d), "good")
    except (KeyError, TypeError, ValueError):     # a damaged recording's result: what it names
        return EventText(f"tuning done: best {setting_words(d.get('best'))} ({d.get('stop_reason', '')})", "good")
