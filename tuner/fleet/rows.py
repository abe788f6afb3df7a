"""One row per server of a fleet, and the aggregate row: what the fleet screen, `once` and the
report show side by side. Pure logic over a member's Store (or plain numbers); no I/O, no threads.

A row is read from the member's session on the poller's thread and handed out frozen. Its `state`
is the session's connection state, made stricter by the row's age: a server that has said nothing
for STALE_S is `degraded (no answer for N s)` however its last poll ended, so a hung server shows
within 2 s even while a poll of it is still waiting for its deadline.
Must not change anything it reads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable

from probes.names import DRAFT, DRAFT_EXTEND
from tuner.core import series as S
from tuner.core.events import EventKind

STALE_S = 1.5           # no record for this long: degraded, whatever the last poll said
RATE_WINDOW_S = 3.0     # tok/s, GPU activity: the mean over the last few polls
ACCEPT_WINDOW_S = 10.0  # tau and the phase split need iterations, which come in bursts
DRAFT_COMM_PHASES = (DRAFT, DRAFT_EXTEND)

# Row states, in the order the sort by state puts them (the worst first).
STATES = ("refused", "gone", "degraded", "connecting", "connected")
SORT_KEYS = ("name", "state", "tok_s", "tau", "draft_comm_pct", "gpu_pct", "http_errors", "age_s")


@dataclass(frozen=True)
class FleetRow:
    """One server. Numbers are None when not known (never 0 for "unknown"); `detail` is the one
    line that goes with the state (why refused, gone or degraded)."""

    name: str
    url: str
    state: str = "connecting"
    detail: str = ""
    kind: str = ""
    setting: dict[str, Any] = field(default_factory=dict)
    tok_s: float | None = None
    tau: float | None = None
    draft_comm_pct: float | None = None
    gpu_pct: float | None = None
    http_errors: int = 0
    last_seen: float | None = None      # session-clock time of the newest record (None: never)
    age_s: float | None = None          # now - last_seen when the row was read out
    draft_comm_trace_age_s: float | None = None   # set: draft_comm_pct is a trace capture's, this old

    def to_json(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in asdict(self).items()}

    @property
    def state_text(self) -> str:
        return f"{self.state} ({self.detail})" if self.detail else self.state


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _mean(store: Any, series: str, t0: float) -> float | None:
    vals = store.window(series, t0).finite()
    return sum(vals) / len(vals) if vals else None


def setting_text(setting: dict[str, Any]) -> str:
    """`steps 3 · topk 1 · draft 4 · sharded` from an active config (missing knobs left out)."""
    from probes.names import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK

    parts = [f"{w} {setting[k]}" for k, w in ((STEPS, "steps"), (TOPK, "topk"), (DRAFT_TOKENS, "draft"))
             if setting.get(k) is not None]
    if setting.get(PLACEMENT):
        parts.append(str(setting[PLACEMENT]))
    return " · ".join(parts) or "n/a"


def read_row(name: str, url: str, session: Any, now: float, last_seen: float | None) -> FleetRow:
    """The row of a member's session as its store stands at `now` (session clock)."""
    st = session.store
    conn = session.connection()
    state = conn.state
    detail = conn.degraded if state == "degraded" else conn.error if state == "disconnected" else ""
    if state == "disconnected":
        state = "gone"
    tok = _mean(st, S.SERVER_TOK_PER_S, now - RATE_WINDOW_S)
    tau = _mean(st, S.SPEC_ACCEPT_LEN, now - ACCEPT_WINDOW_S)
    wall = _mean(st, S.PHASE_WALL_MS, now - ACCEPT_WINDOW_S)
    comm = [_mean(st, S.phase_comm_ms(p), now - ACCEPT_WINDOW_S) for p in DRAFT_COMM_PHASES]
    known = [c for c in comm if c is not None]
    share = 100.0 * sum(known) / wall if known and wall else None
    gpus = [m for m in (_mean(st, n, now - RATE_WINDOW_S) for n in st.series_names("gpu")
                        if n.endswith("/util_pct")) if m is not None]
    errors = len(st.events((EventKind.POLL_ERROR, EventKind.LOAD_ERROR)))
    info = session.server_info()
    return FleetRow(name, url, state, detail, str(info.get("kind") or ""), session.active_config(), tok, tau,
                    share, sum(gpus) / len(gpus) if gpus else None, errors, last_seen)


def aged(row: FleetRow, now: float, stale_s: float = STALE_S) -> FleetRow:
    """The row with its age at `now`; a connected or connecting row silent for `stale_s` becomes
    degraded, saying for how long."""
    age = None if row.last_seen is None else max(0.0, now - row.last_seen)
    out = replace(row, age_s=age)
    if row.state in ("connected", "connecting", "degraded") and age is not None and age >= stale_s:
        out = replace(out, state="degraded", detail=f"no answer for {age:.1f} s")
    return out


def aggregate(rows: Iterable[FleetRow]) -> dict[str, Any]:
    """The fleet as one row: total tok/s, tau weighted by tok/s, states counted, errors summed,
    the oldest sample's age."""
    rows = list(rows)
    toks = [r.tok_s for r in rows if r.tok_s is not None]
    taus = [(r.tau, r.tok_s or 0.0) for r in rows if r.tau is not None]
    weight = sum(w for _, w in taus)
    tau = (sum(t * w for t, w in taus) / weight if weight > 0 else
           sum(t for t, _ in taus) / len(taus) if taus else None)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    ages = [r.age_s for r in rows if r.age_s is not None]
    return {"servers": len(rows), "states": counts, "tok_s": sum(toks) if toks else None, "tau": tau,
            "http_errors": sum(r.http_errors for r in rows), "oldest_age_s": max(ages) if ages else None}


def sort_rows(rows: Iterable[FleetRow], key: str = "name", reverse: bool = False) -> list[FleetRow]:
    """Rows by one of SORT_KEYS; unknown numbers go last either way, ties by name."""
    if key not in SORT_KEYS:
        raise ValueError(f"sort key is one of {', '.join(SORT_KEYS)}")
    rows = sorted(rows, key=lambda r: r.name)
    if key == "name":
        return sorted(rows, key=lambda r: r.name, reverse=reverse)
    if key == "state":
        return sorted(rows, key=lambda r: STATES.index(r.state) if r.state in STATES else -1, reverse=reverse)
    known = [r for r in rows if getattr(r, key) is not None]
    unknown = [r for r in rows if getattr(r, key) is None]
    return sorted(known, key=lambda r: getattr(r, key), reverse=reverse) + unknown


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else fmt.format(x)


COLUMNS = ("server", "state", "setting", "tok/s", "τ", "draft comm", "GPU", "errors", "age")


def draft_comm_text(r: FleetRow) -> str:
    """`12 %` from a live split; `31 % (trace 4 min ago)` from the last trace capture (SGLang)."""
    if r.draft_comm_pct is not None and r.draft_comm_trace_age_s is not None:
        from tuner.core.trace_share import share_text
        return share_text(r.draft_comm_pct, r.draft_comm_trace_age_s)
    return _f(r.draft_comm_pct, "{:.0f} %")


def row_cells(r: FleetRow) -> tuple[str, ...]:
    """The row as the table's cells (COLUMNS), plain text."""
    return (r.name, r.state_text, setting_text(r.setting), _f(r.tok_s, "{:.1f}"), _f(r.tau, "{:.2f}"),
            draft_comm_text(r), _f(r.gpu_pct, "{:.0f} %"), str(r.http_errors),
            _f(r.age_s, "{:.1f} s"))


def aggregate_cells(agg: dict[str, Any]) -> tuple[str, ...]:
    states = ", ".join(f"{n} {s}" for s, n in sorted(agg["states"].items(), key=lambda kv: STATES.index(kv[0])
                                                     if kv[0] in STATES else -1))
    return (f"all {agg['servers']}", states, "", _f(agg["tok_s"], "{:.1f}"), _f(agg["tau"], "{:.2f}"), "", "",
            str(agg["http_errors"]), _f(agg["oldest_age_s"], "{:.1f} s"))


def format_table(rows: list[FleetRow], agg: dict[str, Any]) -> str:
    """The rows and the aggregate as aligned text, one line per server (for `once`)."""
    cells = [COLUMNS, *(row_cells(r) for r in rows), aggregate_cells(agg)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(COLUMNS))).rstrip() for c in cells)
