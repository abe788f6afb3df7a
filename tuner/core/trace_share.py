"""The draft's collective share from a trace capture, with the capture's age: what SGLang's fleet
row and `once` show ("draft coll. 31 % (trace 4 min ago)"), since the plugin cannot split the
collectives that run inside SGLang's CUDA graphs and only a trace times them.

`draft_comm_pct(analysis)` (pure) reads a capture's analysis (probes.trace_result's shape): rank 0's
mean draft and draft-extend `comm_ms` over its mean iteration wall time, the same share the fleet's
rows take from a live phase stream. `save` writes one small `capture.json` next to a capture's rank
files (tuner.core.capture calls it), naming the server by its password-free URL and the capture's
wall-clock time; `newest_saved(url)` finds the newest one for a server, so a command started later
(`once`, the fleet screen after the single-server view closed its session) still has it.
Must not contact a server; reads only capture folders, bounded.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.names import DRAFT, DRAFT_EXTEND

FILE = "capture.json"
MAX_FOLDERS = 256        # only the newest capture folders are looked at (a folder of thousands stays cheap)
MAX_BYTES = 4096         # capture.json is a few hundred bytes; anything larger is not ours


@dataclass(frozen=True)
class TraceShare:
    """One capture's draft-collective share (percent of the iteration) and when it was taken."""

    pct: float
    at: float            # Unix seconds when the capture finished
    trace_id: str = ""

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.at)


def draft_comm_pct(analysis: Any) -> float | None:
    """Rank 0's mean draft + draft-extend collective time as a percent of its mean iteration wall
    time; None when the analysis has no iterations or no such phases."""
    try:
        rank0 = min(analysis["ranks"], key=lambda r: r.get("rank", 0))
        mean = rank0["mean"]
        wall = float(mean["wall_ms"])
        comm = [float(mean["phases"][p]["comm_ms"]) for p in (DRAFT, DRAFT_EXTEND) if p in mean["phases"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not comm or not math.isfinite(wall) or wall <= 0 or not all(map(math.isfinite, comm)):
        return None
    return 100.0 * sum(comm) / wall


def age_text(age_s: float) -> str:
    """`40 s`, `4 min`, `3 h`, `2 d`: how long ago, to the unit that reads at a glance."""
    if age_s < 60:
        return f"{age_s:.0f} s"
    if age_s < 3600:
        return f"{age_s / 60:.0f} min"
    if age_s < 86400:
        return f"{age_s / 3600:.0f} h"
    return f"{age_s / 86400:.0f} d"


def share_text(pct: float, age_s: float) -> str:
    """`31 % (trace 4 min ago)`."""
    return f"{pct:.0f} % (trace {age_text(age_s)} ago)"


def url_key(url: str) -> str:
    """How a saved share names its server: the URL without password or trailing slash."""
    from tuner.core.redact import redact_url
    return redact_url(url).rstrip("/")


def save(folder: Path, url: str, analysis: Any, at: float, trace_id: str = "") -> bool:
    """Write `folder/capture.json` when the analysis has a share; False when it has none or the
    write failed (the capture itself stands either way)."""
    pct = draft_comm_pct(analysis)
    if pct is None:
        return False
    body = {"url": url_key(url), "at": round(at, 3), "trace_id": str(trace_id)[:200], "draft_comm_pct": round(pct, 4)}
    tmp = folder / (FILE + ".tmp")
    try:
        tmp.write_text(json.dumps(body))
        os.replace(tmp, folder / FILE)
    except OSError:
        return False
    return True


def _read(path: Path) -> dict[str, Any] | None:
    from probes.json_file import JsonFileError, read_json

    try:
        data = read_json(path, cap=MAX_BYTES)
    except (JsonFileError, OSError):
        return None
    return data if isinstance(data, dict) else None


def saved_shares(root: Path | None = None) -> dict[str, TraceShare]:
    """The newest saved share per server (password-free URL) among the newest MAX_FOLDERS capture
    folders under `root` (tuner.core.capture.traces_dir() by default); one scan for a whole fleet."""
    from tuner.core.capture import traces_dir

    root = root or traces_dir()
    try:
        with os.scandir(root) as it:
            entries = [e for e in it if e.is_dir(follow_symlinks=False)]
        folders = sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)[:MAX_FOLDERS]
    except OSError:
        return {}
    best: dict[str, TraceShare] = {}
    for f in folders:
        d = _read(Path(f.path) / FILE)
        if d is None or not isinstance(d.get("url"), str):
            continue
        pct, at = d.get("draft_comm_pct"), d.get("at")
        if not isinstance(pct, (int, float)) or not isinstance(at, (int, float)) \
                or not math.isfinite(pct) or not math.isfinite(at):
            continue
        old = best.get(d["url"])
        if old is None or at > old.at:
            best[d["url"]] = TraceShare(float(pct), float(at), str(d.get("trace_id", "")))
    return best


def newest_saved(url: str, root: Path | None = None) -> TraceShare | None:
    """The newest saved share of the server at `url`; None when there is none."""
    return saved_shares(root).get(url_key(url))
