"""What `once` prints: the readings a session took since a moment, as one JSON-ready dict, and the
table people read over SSH (tok/s, acceptance with per-position p_k and a_k, per-phase ms per
iteration with their comm parts, the active setting, what can change live and the remedies).

Used by tuner.commands.once alone. Reads the session's store and backend; must not change anything.
"""

from __future__ import annotations

import math
from typing import Any

from probes.names import R_PHASE_MS
from tuner.core import setting as vocab
from tuner.core.events import EventKind
from tuner.core.redact import redact_url


def _mean(store: Any, series: str, t0: float) -> float:
    vals = store.window(series, t0).finite()
    return sum(vals) / len(vals) if vals else math.nan


def readings(session: Any, t0: float) -> dict[str, Any]:
    """What the session saw since t0, as one JSON-ready dict (NaN -> None)."""
    from tuner.core import series as S

    st = session.store
    out: dict[str, Any] = {
        "server": {k: session.server_info().get(k) for k in ("kind", "version", "model", "tp_size")},
        "url": redact_url(getattr(session.backend, "url", "")),
        "connection": session.connection().text(),
        "active": session.active_config(),
        "tok_per_s": _mean(st, S.SERVER_TOK_PER_S, t0),
        "client_tok_per_s": _mean(st, S.LOAD_TOK_PER_S, t0),
        "accept_len": _mean(st, S.SPEC_ACCEPT_LEN, t0),
        "accept_rate": _mean(st, S.SPEC_ACCEPT_RATE, t0),
        "iter_per_s": _mean(st, S.SERVER_ITER_PER_S, t0),
        "batch_size": _mean(st, S.SERVER_BATCH, t0),
        "accept_pos": {}, "accept_cond": {}, R_PHASE_MS: {}, "phase_comm_ms": {}, "phase_share_pct": {},
    }
    for name in st.series_names("spec/accept_pos/"):
        out["accept_pos"][name.rsplit("/", 1)[1]] = _mean(st, name, t0)
    for name in st.series_names("spec/accept_cond/"):
        out["accept_cond"][name.rsplit("/", 1)[1]] = _mean(st, name, t0)
    for phase in S.PHASES:
        for key, fn in ((R_PHASE_MS, S.phase_ms), ("phase_comm_ms", S.phase_comm_ms),
                        ("phase_share_pct", S.phase_share_pct)):
            if st.latest(fn(phase)) is not None:
                out[key][phase] = _mean(st, fn(phase), t0)
    for key, series in (("wall_ms", S.PHASE_WALL_MS), ("idle_ms", S.PHASE_IDLE_MS)):
        out[key] = _mean(st, series, t0)
    caps = session.backend.capabilities if session.backend is not None else None
    out["live"] = {k: (caps.why_not(k) or "live") for k in vocab.args()} if caps else {}
    out["live_values"] = {k: list(v) for k, v in caps.live_values.items()} if caps else {}
    out["value_notes"] = ({k: {str(x): t for x, t in v.items()} for k, v in caps.value_notes.items()}
                          if caps else {})
    out["missing"] = list(caps.missing) if caps else []
    from tuner.tuning.comm_whatif import session_remedies

    out["remedies"] = session_remedies(session)
    out["still_works"] = caps.still_works if caps else ""
    out["has_phase_timers"] = bool(caps and caps.HAS_PHASE_TIMERS)
    out["problems"] = [e.data.get("error") for e in st.events((EventKind.POLL_ERROR, EventKind.LOAD_ERROR))]
    out["latency"] = latency_window(st, t0)
    out["draft_comm_trace"] = None if _draft_comm_live(out) else trace_share(session)
    return _nan_to_none(out)


def _draft_comm_live(r: dict[str, Any]) -> bool:
    from probes.names import DRAFT, DRAFT_EXTEND
    return any(isinstance(r["phase_comm_ms"].get(p), float) and math.isfinite(r["phase_comm_ms"][p])
               for p in (DRAFT, DRAFT_EXTEND))


def trace_share(session: Any) -> dict[str, Any] | None:
    """The draft's collective share from the newest trace capture of this server (this session's,
    else one saved by an earlier command: tuner.core.trace_share), with its age; None without one.
    What SGLang's `once` shows, since its plugin cannot time the collectives inside CUDA graphs."""
    import time

    from tuner.core import trace_share as T

    analysed = [tr for tr in session.store.traces() if tr.analysis is not None]
    if analysed:
        pct = T.draft_comm_pct(analysed[-1].analysis)
        if pct is not None:
            return {"pct": pct, "age_s": max(0.0, session.now() - analysed[-1].t), "trace_id": analysed[-1].trace_id}
    url = getattr(session.backend, "url", "")
    saved = T.newest_saved(url) if url else None
    if saved is None:
        return None
    return {"pct": saved.pct, "age_s": saved.age_s(time.time()), "trace_id": saved.trace_id}


def latency_window(st: Any, t0: float) -> dict[str, Any]:
    """tuner.core.latency.window_readout since t0: the load driver's exact percentiles and the
    server's histogram buckets."""
    from tuner.core import latency as L

    kinds = (EventKind.LOAD_REQUEST, EventKind.LATENCY_BUCKETS, EventKind.LATENCY_UNAVAILABLE)
    return L.window_readout(st.events(kinds), t0, math.inf)


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    return x


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def format_table(r: dict[str, Any]) -> str:
    s, a = r["server"], r["active"]
    lines = [
        f"server    {s.get('kind')} {s.get('version')} · {s.get('model')} · TP {s.get('tp_size')} · {r['url']} ({r['connection']})",
        "setting   " + " · ".join(f"{k.replace('speculative_', '')}={v}" for k, v in a.items()
                                  if k.startswith("speculative_") and k != "speculative_algorithm"),
        f"tok/s     {_f(r['tok_per_s'], '{:.1f}')} (server)"
        + (f"   {_f(r['client_tok_per_s'], '{:.1f}')} (client)" if r["client_tok_per_s"] is not None else "")
        + f"   iterations/s {_f(r['iter_per_s'], '{:.1f}')}   batch {_f(r['batch_size'], '{:.1f}')}",
        f"accept    length {_f(r['accept_len'])}   rate {_f(r['accept_rate'])}",
    ]
    if r["accept_pos"]:
        ks = sorted(r["accept_pos"], key=int)
        lines.append("p_k       " + "  ".join(f"p{k} {_f(r['accept_pos'][k])}" for k in ks))
        lines.append("a_k       " + "  ".join(f"a{k} {_f(r['accept_cond'].get(k))}" for k in ks))
    if r[R_PHASE_MS]:
        lines.append(f"phase     {'ms/iter':>9} {'comm ms':>9}")
        for p, v in r[R_PHASE_MS].items():
            lines.append(f"  {p:<14}{_f(v, '{:9.3f}')} {_f(r['phase_comm_ms'].get(p), '{:9.3f}')}")
        lines.append(f"  {'wall':<14}{_f(r.get('wall_ms'), '{:9.3f}')}   idle {_f(r.get('idle_ms'), '{:.3f}')}")
    elif r["phase_share_pct"]:
        lines.append("phase     " + "  ".join(f"{p} {_f(v, '{:.1f}')}%" for p, v in r["phase_share_pct"].items())
                     + "  (share of wall time; no iteration count)")
    elif r.get("has_phase_timers"):
        lines.append("phase     n/a (no decode iterations while watching: try --load N)")
    else:
        lines.append("phase     n/a (no phase timers on this server)")
    if r.get("draft_comm_trace"):
        from tuner.core.trace_share import share_text
        d = r["draft_comm_trace"]
        lines.append(f"draft coll. {share_text(d['pct'], d['age_s'])}")
    lines.append("live      " + "  ".join(f"{k.replace('speculative_', '')}: {'yes' if v == 'live' else 'no'}"
                                          for k, v in r["live"].items()))
    for k, vals in r.get("live_values", {}).items():
        notes = r.get("value_notes", {}).get(k, {})
        lines.append(f"          {k.replace('speculative_', '')} takes {', '.join(map(str, vals)) or 'nothing'} live"
                     + "".join(f"; {v} {t}" for v, t in notes.items()))
    if r.get("latency"):
        from tuner.core.latency import readout_lines
        lines += readout_lines(r["latency"])
    for m in r.get("remedies", []):
        lines.append(f"remedy    {m}")
    for m in r.get("missing", []):
        lines.append(f"missing   {m}")
    if r.get("missing") and r.get("still_works"):
        lines.append(f"          {r['still_works']}")
    for p in dict.fromkeys(r["problems"]):
        lines.append(f"problem   {p}")
    return "\n".join(lines)
