"""Acceptance counts per setting from a recording, per batch-size and context bucket, and the
speculation_profile.json documents built from them.

A recording keeps, per phase-stream page, the request-verifies and p_1..p_s of the whole page
(`spec/verifies`, `spec/accept_pos/<k>`) and of each bucket (`spec/<bucket>/verifies`, ...); with
longest-prefix acceptance those give the page's correct-drafts histogram back exactly
(probes.accept_buckets.histogram_from_positions), so counts add up across pages and a profile is
built from counts, not from averaged rates. A page is counted for a setting only when the steps,
topk and draft tokens read at its time are the setting's. Recordings made before the buckets
existed still give the whole-setting counts.

Pure functions over RecordingData and its segments (tuner.core.segments); must not import textual or write files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from probes import accept_buckets as AB
from probes import speculation_profile as SP
from tuner.core import series as S
from tuner.core import setting as vocab
from tuner.core.segments import Segment, setting_label
from tuner.report.data import RecordingData, Series

MIN_VERIFIES = 200
"""A profile needs at least this many verify rounds (request-verifies) of its setting."""


@dataclass
class SettingCounts:
    """Correct-drafts histograms of one setting: all of it, and per bucket (bs8, ctx512, ...)."""

    key: tuple
    label: str
    steps: int
    topk: int
    hist: list[int] = field(default_factory=list)
    buckets: dict[str, list[int]] = field(default_factory=dict)
    pages: int = 0

    @property
    def verifies(self) -> int:
        return int(sum(self.hist))

    def to_json(self) -> dict[str, Any]:
        out = {"setting": self.label, "verifies": self.verifies, "buckets": {}}
        for name in sorted(self.buckets, key=AB.sort_key):
            a = AB.position_acceptance(self.buckets[name], self.steps)
            out["buckets"][name] = {"range": AB.bucket_range(name), "verifies": a.verifies,
                                    "p": [_f(x) for x in a.p], "alpha": [_f(x) for x in a.alpha], "tau": _f(a.tau)}
        return out


def _f(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _at(series: Series) -> dict[float, float]:
    return dict(zip(series.t, series.v))


def _same(x: float, want: Any) -> bool:
    """A knob read at a page's time is the setting's (a missing reading does not disagree)."""
    return math.isnan(x) or want is None or x == want


def collect(data: RecordingData, segments: list[Segment]) -> list[SettingCounts]:
    """Counts per speculative setting (steps > 0), in the order the settings were first tried."""
    verifies = data.get(S.SPEC_VERIFIES)
    knobs = [_at(data.get(n)) for n in (S.SPEC_NUM_STEPS, S.SPEC_TOPK, S.SPEC_NUM_DRAFT_TOKENS)]
    bucket_names = sorted({n.split("/")[1] for n in data.names("spec/")
                           if n.count("/") == 2 and n.endswith("/verifies") and AB.parse_bucket(n.split("/")[1])},
                          key=AB.sort_key)
    pos_cache: dict[str, dict[float, float]] = {}

    def pos(name: str) -> dict[float, float]:
        if name not in pos_cache:
            pos_cache[name] = _at(data.get(name))
        return pos_cache[name]

    bucket_verifies = {b: _at(data.get(S.bucket_verifies(b))) for b in bucket_names}
    out: dict[tuple, SettingCounts] = {}
    for seg in segments:
        steps, topk, ndt = seg.key[0], seg.key[1], seg.key[2]
        if not isinstance(steps, int) or steps <= 0:
            continue
        c = out.get(seg.key)
        if c is None:
            c = out[seg.key] = SettingCounts(seg.key, setting_label(seg.key), steps,
                                             topk if isinstance(topk, int) else 1)
        # Segments are [t0, t1); the recording's last reading closes the last one.
        ts, vs = verifies.between(seg.t0, math.nextafter(seg.t1, math.inf) if seg.t1 >= data.t_last else seg.t1)
        for t, v in zip(ts, vs):
            if not all(_same(k.get(t, math.nan), w) for k, w in zip(knobs, (steps, topk, ndt))):
                continue
            ps = [pos(S.accept_pos(k)).get(t, math.nan) for k in range(1, steps + 1)]
            h = AB.histogram_from_positions(v, ps)
            if h is None:
                continue
            c.hist = AB.add(c.hist, h)
            c.pages += 1
            for b in bucket_names:
                bv = bucket_verifies[b].get(t)
                if bv is None:
                    continue
                bh = AB.histogram_from_positions(bv, [pos(S.bucket_accept_pos(b, k)).get(t, math.nan)
                                                      for k in range(1, steps + 1)])
                if bh is not None:
                    c.buckets[b] = AB.add(c.buckets.get(b, []), bh)
    return [c for c in out.values() if c.verifies > 0]


def profiles(counts: list[SettingCounts], data: RecordingData) -> tuple[list[dict[str, Any]], list[str]]:
    """(one profile per setting with >= MIN_VERIFIES verify rounds, a note per setting left out)."""
    info = data.server_info()
    launch = info.get("launch") or data.header.get("launch") or {}
    out, notes = [], []
    for c in counts:
        if c.verifies < MIN_VERIFIES:
            notes.append(f"{c.label}: {c.verifies} verify rounds, fewer than {MIN_VERIFIES}: no profile")
            continue
        per_category = {b: SP.category(h, c.steps, AB.bucket_range(b))
                        for b, h in sorted(c.buckets.items(), key=lambda kv: AB.sort_key(kv[0])) if sum(h) > 0}
        out.append(SP.build(
            c.hist, c.steps, chain=c.topk == 1, method="eagle3",
            target_model=launch.get("served_model_name") or launch.get("model_path") or info.get("model"),
            draft_checkpoint=launch.get("speculative_draft_model_path"),
            per_category=per_category, conditions=_conditions(c, data, info, launch)))
    return out, notes


def _conditions(c: SettingCounts, data: RecordingData, info: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    # The key is a setting_key (the knob table's order); a knob the server did not report is left out.
    setting = {arg: v for arg, v in zip(vocab.args(), c.key) if v is not None}
    gpus = [g.get("name") for g in (data.header.get("gpus") or []) if isinstance(g, dict) and g.get("name")]
    # The curve as given (it is numbers); a profile file is named by what it simulated, never by its path.
    sim = launch.get("speculative_simulate_accept") or bool(launch.get("speculative_simulate_accept_profile"))
    return {
        "engine": data.header.get("backend"), "engine_version": info.get("version"),
        "tp_size": info.get("tp_size"), "setting": setting, "setting_label": c.label,
        "verify_rounds": c.verifies, "gpu": gpus or None, "dataset": None,
        "simulated_acceptance": sim or bool(info.get("simulated_accept")),
        "source": "specdecode-tune report (recording " + data.path.name + ")",
        "buckets": "batch size: SGLang's adaptive thresholds plus powers of two; context: powers of two from 256",
    }


def bucket_table(counts: list[SettingCounts]) -> tuple[list[str], list[list[str]]]:
    """The report's table: one row per (setting, bucket) with its verify rounds, τ, and p_k / α_k."""
    depth = max((c.steps for c in counts if c.buckets), default=0)
    head = ["setting", "bucket", "verify rounds", "τ"] + [f"p{k} / α{k}" for k in range(1, depth + 1)]
    rows = []
    for c in counts:
        for name in sorted(c.buckets, key=AB.sort_key):
            a = AB.position_acceptance(c.buckets[name], c.steps)
            if not a.verifies:
                continue
            cells = [f"{p:.3f} / {al:.2f}" if math.isfinite(al) else f"{p:.3f} / n/a" for p, al in zip(a.p, a.alpha)]
            rows.append([c.label, AB.bucket_range(name), str(a.verifies), f"{a.tau:.2f}"]
                        + cells + [""] * (depth - len(cells)))
    return head, rows
