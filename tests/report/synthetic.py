"""A recording with known figures, written through the real Recorder (a real SQLite file), so the
report's arithmetic can be checked exactly: two settings, a server gap, a capture window, tuning
events. Only the readings are made up; the file format and reader are the real ones."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from tuner.core import series as S
from tuner.core.records import Event, Sample
from tuner.recording import Recorder

T0 = 1_800_000_000.0
RATE_HZ = 4
A = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
     "speculative_draft_placement": "sharded"}
B = {**A, "speculative_num_steps": 4, "speculative_num_draft_tokens": 5, "speculative_draft_placement": "rank0"}

# Per setting: tok/s, accept length, phase ms (inclusive) and their comm parts, batch.
FIG = {
    "A": {"tok": 100.0, "tau": 3.0, "phase": {"prefill": 2.0, "draft": 10.0, "verify": 40.0, "verify_sample": 1.0,
                                            "draft_extend": 5.0, "other": 2.0},
          "comm": {"prefill": 0.5, "draft": 6.0, "verify": 20.0, "verify_sample": 0.0, "draft_extend": 3.0,
                   "other": 1.0}},
    "B": {"tok": 130.0, "tau": 3.5, "phase": {"prefill": 1.0, "draft": 4.0, "verify": 39.0, "verify_sample": 1.0,
                                            "draft_extend": 2.0, "other": 3.0},
          "comm": {"prefill": 0.25, "draft": 0.0, "verify": 19.0, "verify_sample": 0.0, "draft_extend": 0.0,
                   "other": 1.0}},
}
CHANGE_AT = 30.0          # A before, B after (seconds from T0)
GAP = (45.0, 50.0)        # server gone
END = 70.0


def write(path: Path, *, emulate: str | None = None, tuning: bool = False, settle_noise: bool = True,
          extra: Sequence[Any] = ()) -> Path:
    """`extra`: more records (seconds on the recording's clock, T0 included), e.g. latency events."""
    launch = {**A, "tp_size": 2, "model_path": "tiny", "emulate_comm_latency": emulate, "api_key": "sekrit"}
    info = {"kind": "refengine", "version": "0.1.0", "model": "tiny", "tp_size": 2, "launch": launch,
            "active": dict(A), "emulated_comm": bool(emulate), "simulated_accept": False}
    rec = Recorder(path, {"backend": "refengine", "url": "http://127.0.0.1:1", "server_info": info,
                          "active": dict(A), "launch": launch, "command": "synthetic"})
    out: list[Any] = [Event(T0, "connected", {"url": "http://127.0.0.1:1", "backend": "refengine", "after_s": 0}),
                      Event(T0, "server_info", info)]
    it = 0
    n = int(END * RATE_HZ)
    for i in range(n + 1):
        t = T0 + i / RATE_HZ
        rel = t - T0
        if GAP[0] <= rel < GAP[1]:
            if rel == GAP[0]:
                out.append(Event(t, "disconnected", {"url": "x", "since": t, "error": "connection refused"}))
            continue
        if rel == GAP[1]:
            out.append(Event(t, "connected", {"url": "x", "backend": "refengine", "after_s": GAP[1] - GAP[0]}))
        if rel == CHANGE_AT:
            out.append(Event(t, "config_changed", {"old": dict(A), "new": dict(B), "epoch": 2, "source": "phase_stream"}))
        f = FIG["A" if rel < CHANGE_AT else "B"]
        since = rel - (CHANGE_AT if rel >= CHANGE_AT else 0.0)
        # Right after a change the readings are off (the settling the report must drop).
        bad = settle_noise and since < 1.5
        it += 5
        wall = sum(f["phase"].values())
        out += [Sample(t, S.SERVER_TOK_PER_S, f["tok"] * (0.2 if bad else 1.0)),
                Sample(t, S.SERVER_ITERATIONS, float(it)),
                Sample(t, S.SPEC_ACCEPT_LEN, f["tau"]),
                Sample(t, S.SERVER_BATCH, 2.0),
                Sample(t, S.PHASE_WALL_MS, wall),
                Sample(t, S.PHASE_IDLE_MS, 0.0),
                Sample(t, S.accept_pos(1), 0.9), Sample(t, S.accept_pos(2), 0.7), Sample(t, S.accept_pos(3), 0.4)]
        if rel >= CHANGE_AT:
            out.append(Sample(t, S.accept_pos(4), 0.2))
        for p, v in f["phase"].items():
            out += [Sample(t, S.phase_ms(p), v), Sample(t, S.phase_comm_ms(p), f["comm"][p])]
        out.append(Sample(t, "gpu0/sm_active_pct", math.nan if i % 7 == 0 else 50.0 + 10 * (rel >= CHANGE_AT)))
    if tuning:
        out += [Event(T0 + 60, "tuning_prediction", {"bs": 2, "best": {"steps": 4, "topk": 1, "num_draft_tokens": 5,
                                                                        "placement": "rank0", "tok_s": 128.0},
                                                      "predictions": [
                                                          {"steps": 4, "topk": 1, "num_draft_tokens": 5, "placement": "rank0",
                                                           "tok_s": 128.0, "sd": 3.0, "tau": 3.5, "t_ms": 50.0, "basis": "measured"},
                                                          {"steps": 2, "topk": 1, "num_draft_tokens": 3, "placement": "sharded",
                                                           "tok_s": 90.0, "sd": 5.0, "tau": 2.6, "t_ms": 55.0, "basis": "model"}],
                                                      "model": {}}),
                Event(T0 + 61, "tuning_applied", {"setting": {"steps": 4, "topk": 1, "num_draft_tokens": 5,
                                                              "placement": "rank0"}, "predicted_tok_s": 128.0,
                                                  "predicted_gain": 0.28})]
    out += list(extra)
    out.sort(key=lambda r: r.t)
    rec.write(out)
    rec.close()
    return path
