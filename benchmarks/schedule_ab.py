"""Proof under a load that moves: a per-batch-size schedule against the best fixed setting and
against SGLang's acceptance-only policy, on one live `serve` with simulated 8B acceptance.

Phase 1, the sweep. At each load bucket (closed-loop concurrency 1 and C by default, `--buckets` for
more) every chain setting (`--steps`, 0..7; steps 0 = SGLang's tier 0) is applied live and measured
after settling: tok/s is the median of 1-s windows of committed tokens from the server's phase
records. It prints each bucket's best setting and says plainly when they coincide (then the schedule
is a fixed setting: a finding to explain, not a pass). The best fixed setting is the one with the
best time-weighted tok/s over the moving load; the sweep's ceiling is the most any schedule could
gain over it by the sweep's own figures (below the goal, the goal is out of reach on that host).
Output lengths are seeded uniform in [(1 - F) N, (1 + F) N] (`--length-spread F`, 0.5): equal
lengths run a closed loop in lockstep waves that drain the batch. `--from-tune FILE` takes the schedule from
`specdecode-tune tune --schedule --json` instead (the sweep then only finds the best fixed setting,
unless `--fixed STEPS` names it).

Phase 2, the A/B. A fixed, seeded script: closed-loop concurrency 1 for `--phase-s`, then C, which
is one cycle; `--cycles` cycles (≥ 6 for the goal). One arm runs each cycle, every arm once per round
of three in a seeded order, switched live between cycles (`/set_internal_state`, no restart):
  schedule    an adaptive config pinning each bucket's best (one candidate per tier), installed live;
  fixed       the best fixed setting (the schedule removed);
  acceptance  SGLang's acceptance-only policy with its default tiers (adaptive without a config).
Each phase counts from when it settled (the later of --settle-s and 20 iterations after the switch).
Before the measured cycles each arm runs one short unmeasured cycle (graphs, caches, the policy).
It prints tok/s per load phase for each arm with 95 % bootstrap intervals (resampling the arm's
cycles, then the windows in each: a cycle's windows share the host's state), the ratios
schedule/fixed and schedule/acceptance per phase, their time-weighted mean, and the goal line:
PASS when both means are ≥ 1.05 and no phase's interval lies wholly below 1.0, else MISS and why. A
phase where the schedule and the other arm ran the very same steps counts as exactly 1.0 in the
goal's mean (its measured ratio is the host's noise; both means are printed).
`--open-loop RATE` replaces the closed loop with a seeded Poisson script of RATE requests/s, the
same arrivals every cycle, and reports TPOT and end-to-end p50/p99 per arm.

    python benchmarks/schedule_ab.py --json OUT.json                       # CPU: tiny preset, C = 16
    python benchmarks/schedule_ab.py --device cuda --only sweep --json table.json     # H200 call 1
    python benchmarks/schedule_ab.py --device cuda --only ab --table table.json --json ab.json  # call 2

It prints a wall-time estimate first and refuses, in one line, a plan over `--max-wall-s` (540 s on
CUDA: one device call). Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

import folded  # noqa: E402
import schedule_stats as st  # noqa: E402
from engine_runs import PAPER_TAU_T1, base_env, published_curve, workload_curve  # noqa: E402
from probes import adaptive_policy  # noqa: E402
from tuner.core import windows as W  # noqa: E402

DEVICE_DEFAULTS = {  # model, C, max new tokens, --max-wall-s, server start-up estimate (s)
    "cpu": ("tiny-agreeing", 16, 128, 1200.0, 40.0),
    "cuda": ("llama-3.1-8b", 64, 256, 540.0, 120.0),
}
PROMPT_LEN = 32
CUDA_MAX_GRAPHS = 512


class ServerGone(RuntimeError):
    """The server stopped answering mid-run (its phase stream failed)."""


# -- the server and what it records -----------------------------------------------------------------
class Bench:
    """One live server: its phase records (kept whole), the closed-loop load and live switches."""

    def __init__(self, url: str, prompts: list[dict], max_new_tokens: int,
                 prompts_by_load: dict[int, list[dict]] | None = None) -> None:
        import httpx

        from tuner.core.bus import Bus
        from tuner.tuning.phase_feed import HttpPhaseFeed

        self.url, self.prompts, self.max_new_tokens = url, prompts, max_new_tokens
        self.prompts_by_load = prompts_by_load or {}   # a load's own workload (--accept-by-load)
        self.http = httpx.Client(base_url=url, timeout=120.0, trust_env=False)
        self.feed = HttpPhaseFeed(url, interval=0.2)
        self.bus = Bus()             # the load driver's samples: drained and dropped (records are the figures)
        self.driver = None
        self.load = 0
        self.records: list[dict] = []
        self.load_errors = 0

    def close(self) -> None:
        self.set_load(0)
        self.feed.close()
        self.http.close()

    def collect(self) -> None:
        self.records += self.feed.poll()
        self.bus.drain()

    def hold(self, seconds: float) -> None:
        """Wait `seconds`, collecting records as they come."""
        end = time.time() + seconds
        pace = threading.Event()
        while True:
            self.collect()
            left = end - time.time()
            if left <= 0:
                return
            pace.wait(min(0.1, left))

    def set_load(self, concurrency: int) -> None:
        """Closed-loop load of `concurrency` streams (0: none). The old streams are closed first, so
        the server aborts them and the new batch size holds from here."""
        from tuner.backends.load import LoadDriver
        from tuner.core.clock import SystemClock

        if self.driver is not None:
            self.load_errors += self.driver.errors
            self.driver.stop()
            self.driver = None
        self.load = concurrency
        if concurrency:
            self.driver = LoadDriver(self.url, self.bus, SystemClock(),
                                     self.prompts_by_load.get(concurrency, self.prompts), concurrency,
                                     max_new_tokens=self.max_new_tokens)
            self.driver.start()

    def healthy(self) -> bool:
        import httpx

        try:
            return self.http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def apply(self, changes: dict[str, Any]) -> None:
        r = self.http.post("/set_internal_state", json={"server_args": changes})
        if r.status_code != 200:
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text[:200]
            raise st.PlanError(f"/set_internal_state {json.dumps(changes)}: HTTP {r.status_code}: {msg}")

    def caught_up(self, t1: float, timeout_s: float = 3.0) -> None:
        """Wait until the feed has handed over a record that ended after t1 (the records of a phase
        arrive up to a poll interval late), or timeout_s passed (no load: none will come)."""
        end = time.time() + timeout_s
        while not (self.records and self.records[-1]["t"] > t1) and time.time() < end:
            self.hold(0.1)

    def measure(self, t0: float, t1: float, settle_s: float, catch_up_s: float = 3.0) -> dict[str, Any]:
        """A phase [t0, t1]: its settled 1-s tok/s windows and what ran in it."""
        self.caught_up(t1, catch_up_s)
        recs = [r for r in self.records if t0 <= r["t"] <= t1]
        settled = st.settled_from(t0, [r["t"] for r in recs], settle_s)
        # A graph capture stalls the server: its span (and the catch-up after it) belongs to no side.
        exclude = [(r["t"] - r.get("wall_ms", 0.0) / 1e3, r["t"] + W.CAPTURE_CATCH_UP_S)
                   for r in recs if r.get("capture")]
        used = [r for r in recs if r["t"] >= settled]
        wins = st.window_rates([r["t"] for r in used], [r["committed"] for r in used], settled, t1,
                               exclude=exclude) if math.isfinite(settled) else []
        steps = Counter(r["steps"] for r in used)
        verifies = sum(len(r.get("accepted") or ()) for r in used)
        tau = (sum(r["committed"] for r in used) / verifies) if verifies else math.nan
        return {"t0": t0, "t1": t1, "settled_s": (settled - t0) if math.isfinite(settled) else None,
                "windows": wins, "iterations": len(used), "captures": len(exclude),
                "steps_ran": {str(k): v for k, v in sorted(steps.items())},
                "mean_bs": (sum(r["bs"] for r in used) / len(used)) if used else math.nan, "tau": tau}


def prompts_for(seed: int, vocab: int, n: int = 64, max_new_tokens: int = 128, spread: float = 0.0) -> list[dict]:
    """The seeded prompts (token ids) and their output lengths, the same for every arm and cycle.

    Each prompt's max_new_tokens is drawn uniformly from [(1 - spread) N, (1 + spread) N] (mean N).
    With every request N tokens long (spread 0), a closed loop started at once finishes in lockstep
    where nothing breaks the tie (steps 0: one token per request per iteration): the whole batch
    drains, waits for its clients, and refills together, every wave. Servers never see that.
    """
    rng = random.Random(seed)
    lo, hi = max_new_range(max_new_tokens, spread)
    return [{"input_ids": [rng.randrange(1, max(2, vocab - 1)) for _ in range(PROMPT_LEN)],
             "sampling_params": {"max_new_tokens": rng.randint(lo, hi) if hi > lo else lo}} for _ in range(n)]


def with_curve(prompts: list[dict], curve: tuple[float, ...]) -> list[dict]:
    """The same prompts, each carrying a workload's acceptance curve (the engine's per-request
    `simulate_accept`): the load's requests accept like that workload, whatever ran before."""
    return [{**p, "sampling_params": {**p["sampling_params"], "simulate_accept": list(curve)}} for p in prompts]


def accept_by_load(text: str | None) -> dict[int, str]:
    """`--accept-by-load 1=mtbench,256=humaneval` -> {1: "mtbench", 256: "humaneval"}."""
    out: dict[int, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        load, _, name = part.partition("=")
        if not load.strip().isdigit() or name.strip() not in PAPER_TAU_T1:
            raise st.PlanError(f"--accept-by-load: {part.strip()!r} is not LOAD=WORKLOAD with a workload of "
                               f"{', '.join(PAPER_TAU_T1)}")
        out[int(load)] = name.strip()
    return out


def max_new_range(n: int, spread: float) -> tuple[int, int]:
    return max(1, round(n * (1 - spread))), max(1, round(n * (1 + spread)))


def serve_args(a) -> list[str]:
    curve = ",".join(str(x) for x in published_curve())
    out = ["--device", a.device, "--tp-size", "1", "--model-path", a.model_path, "--host", "127.0.0.1",
           "--port", "0", "--max-running-requests", str(max([a.concurrency, *a.buckets])),
           "--context-length", str(PROMPT_LEN + max_new_range(a.max_new_tokens, a.length_spread)[1] + 64), "--random-seed", str(a.seed),
           "--speculative-num-steps", "3", "--speculative-simulate-accept", curve]
    if not Path(a.model_path).exists():
        out += ["--load-format", "dummy"]
    if a.device == "cuda":
        # SGLang captures every batch size (every tier, when adaptive) at start and keeps them. The
        # engine's default cache of 64 graphs per scope holds about one setting's verify and extend
        # keys at C = 64: the sweep and the interleaved arms would evict and re-capture, each a stall
        # that costs the phase its windows (the first H200 run lost steps 1 and 3 at load 64 so).
        # Loads past 64 add row buckets (128, 256) to every setting's keys: room for them too.
        out += ["--cuda-graph-max-graphs", str(CUDA_MAX_GRAPHS * (2 if max([a.concurrency, *a.buckets]) > 64 else 1))]
    return out + a.server_args


# -- phase 1: the sweep -----------------------------------------------------------------------------
def sweep(b: Bench, a) -> dict[str, Any]:
    rng = random.Random(a.seed)
    wins: dict[int, dict[int, list[float]]] = {bk: {s: [] for s in a.steps} for bk in a.buckets}
    points = []
    first = len(b.records)
    print(f"== sweep: {len(a.buckets)} buckets x {len(a.steps)} settings x {a.sweep_repeats} passes, "
          f"{a.sweep_s:g} s each after settling", flush=True)
    for rep in range(a.sweep_repeats):
        for bucket in a.buckets:
            b.set_load(bucket)
            order = list(a.steps)
            rng.shuffle(order)             # host drift must not favour the settings measured first
            for s in order:
                m = sweep_point(b, a, s)
                med, lo, hi = st.median_interval(m["windows"])
                wins[bucket][s] += m["windows"]
                points.append({"pass": rep + 1, "bucket": bucket, "steps": s, "tok_s": med, "lo": lo, "hi": hi, **m})
                print(f"   pass {rep + 1} load {bucket:3d}  steps {s}  {med:8.1f} tok/s [{lo:.1f}, {hi:.1f}]  "
                      f"tau {m['tau']:.2f}  bs {m['mean_bs']:.1f}  ({len(m['windows'])} windows)", flush=True)
    b.set_load(0)
    # Every pass's windows pooled: one median per (bucket, setting).
    table = {bk: {s: st.median_interval(w)[0] for s, w in row.items()} for bk, row in wins.items()}
    return {**conclude_sweep(table, points, a), "graphs": st.capture_summary(b.records[first:])}


def sweep_point(b: Bench, a, s: int) -> dict[str, Any]:
    """Apply steps s (fixed), hold until settled (20 iterations too), then sweep_s more; measure."""
    b.apply({"speculative_adaptive_config": None, "speculative_num_steps": s})
    t0 = time.time()
    b.hold(a.settle_s)
    deadline = t0 + a.settle_s + a.sweep_s + 60.0
    while True:
        b.collect()
        settled = st.settled_from(t0, [r["t"] for r in b.records if r["t"] >= t0], a.settle_s)
        if math.isfinite(settled) or time.time() > deadline:
            break
        b.hold(0.2)
    if not math.isfinite(settled):
        return b.measure(t0, time.time(), a.settle_s)
    b.hold(max(0.0, settled + a.sweep_s + 0.05 - time.time()))
    # A first visit captures graphs (a batch dip can reach a new batch bucket at any time); each
    # capture's stall is left out and restarts the windows. Hold on until the point has sweep_s
    # seconds of windows, within a bounded overrun, so a setting is not left unmeasured for it.
    wanted = max(1, math.ceil(a.sweep_s / W.WINDOW_S))
    overrun = time.time() + max(2 * a.sweep_s, 4.0)
    while True:
        m = b.measure(t0, time.time(), a.settle_s, catch_up_s=0.5)
        if len(m["windows"]) >= wanted or time.time() > overrun:
            return m
        b.hold(W.WINDOW_S)


def conclude_sweep(table: dict[int, dict[int, float]], points: list, a) -> dict[str, Any]:
    weights = {1: a.phase_s[0], a.concurrency: a.phase_s[1]}
    bests = st.best_per_bucket(table)
    fixed, fixed_tps = st.best_fixed(table, weights)
    ceiling = st.schedule_ceiling(table, weights, fixed)
    unmeasured = {str(bk): [s for s, v in sorted(row.items()) if not math.isfinite(v)] for bk, row in table.items()}
    return {"buckets": a.buckets, "steps": a.steps, "weights": {str(k): v for k, v in weights.items()},
            "unmeasured": {k: v for k, v in unmeasured.items() if v},
            "tok_s": {str(bk): {str(s): v for s, v in sorted(row.items())} for bk, row in table.items()},
            "bests": {str(k): v for k, v in bests.items()}, "coincide": st.bests_coincide(bests),
            "best_fixed": {"steps": fixed, "time_weighted_tok_s": fixed_tps}, "ceiling": ceiling,
            "schedule_config": st.schedule_config(bests), "points": points}


def print_sweep(sw: dict[str, Any]) -> None:
    buckets = [str(b) for b in sw["buckets"]]
    print("\n== sweep table (tok/s, median of settled 1-s windows)")
    print("   steps " + "".join(f"{'load ' + b:>12}" for b in buckets))
    for s in sw["steps"]:
        print(f"   {s:5d} " + "".join(f"{sw['tok_s'][b].get(str(s), math.nan):12.1f}" for b in buckets))
    print("   best  " + "".join(f"{'steps ' + str(sw['bests'][b]):>12}" for b in buckets if b in sw["bests"]))
    print_bests(sw["bests"], "the sweep")
    for b, missing in sw.get("unmeasured", {}).items():
        print(f"   NOT MEASURED at load {b}: steps {', '.join(map(str, missing))} (no settled window): that "
              f"bucket's best is among the rest only; raise --sweep-s before reading it", flush=True)
    bf = sw["best_fixed"]
    print(f"   best fixed setting over the moving load: steps {bf['steps']} "
          f"({bf['time_weighted_tok_s']:.1f} tok/s time-weighted)")
    print(f"   schedule (adaptive config): {brief(sw['schedule_config'])}")
    ceiling = sw.get("ceiling", math.nan)
    if math.isfinite(ceiling):
        print(f"   ceiling: by these figures a schedule can gain at most {ceiling:.3f}x over the best fixed setting "
              f"(time-weighted each bucket's best / the fixed setting's tok/s there)"
              + (f"; below the goal's {st.GOAL_RATIO}: the goal against the best fixed setting cannot be met "
                 f"here, whatever the schedule does" if ceiling < st.GOAL_RATIO else ""), flush=True)
    print_graphs(sw.get("graphs"))


def print_graphs(g: dict[str, Any] | None) -> None:
    if g and g["captures"]:
        print(f"   graph captures: {g['captures']} of {g['keys']} keys, {g['recaptures']} re-captures"
              + (f", {g['failed']} failed" if g["failed"] else "")
              + (" (the engine's graph cache dropped keys that were used again: raise --cuda-graph-max-graphs)"
                 if g["recaptures"] else ""), flush=True)


def print_bests(bests: dict[str, int], source: str) -> None:
    line = ", ".join(f"load {k}: steps {v}" for k, v in bests.items())
    print(f"   each bucket's best ({source}): {line}")
    if st.bests_coincide({int(k): v for k, v in bests.items()}):
        print(f"   FINDING: the buckets' bests coincide (steps {next(iter(bests.values()))} everywhere): the "
              f"schedule is that fixed setting, so schedule/fixed can only read about 1.0. This needs "
              f"explaining (verify cost that does not grow with batch x draft tokens on this host?); "
              f"it is not a pass.", flush=True)


# -- phase 2: the A/B --------------------------------------------------------------------------------
def brief(cfg: dict[str, dict]) -> str:
    """An adaptive config as thresholds and candidates only (the knobs are in the JSON)."""
    return ", ".join(f"bs>={k}: {v['candidate_steps']}" for k, v in cfg.items())


def arm_changes(arm: str, schedule_cfg: dict, fixed_steps: int) -> dict[str, Any]:
    if arm == "schedule":
        return {"speculative_adaptive_config": schedule_cfg}
    if arm == "fixed":
        return {"speculative_adaptive_config": None, "speculative_num_steps": fixed_steps}
    return {"speculative_adaptive_config": adaptive_policy.config_json(adaptive_policy.default_config())}


def closed_cycle(b: Bench, a, phase_s: tuple[float, float], measure: bool) -> list[dict]:
    out = []
    for load, secs in zip((1, a.concurrency), phase_s):
        b.set_load(load)
        t0 = time.time()
        b.hold(secs)
        if measure:
            out.append({"load": load, **b.measure(t0, time.time(), a.settle_s)})
    return out


def open_cycle(b: Bench, a, ol, offsets: list[float]) -> dict[str, Any]:
    t0 = time.time()
    done = threading.Event()
    res: list = []
    th = threading.Thread(target=lambda: (res.append(ol.run(offsets, t0)), done.set()), daemon=True)
    th.start()
    while not done.is_set():
        b.hold(0.5)
    t1 = time.time()
    m = b.measure(t0, t1, a.settle_s, catch_up_s=0.5)
    reqs = [r for r in res[0] if r["sent"] >= t0 + a.settle_s]   # the settling requests are no arm's
    return {"requests": reqs, "all_requests": len(res[0]), **m}


def ab(b: Bench, a, schedule_cfg: dict, fixed_steps: int, deadline: float,
       cycles: list[dict] | None = None) -> dict[str, Any]:
    """The A/B; each finished cycle is appended to `cycles` (the caller's list, so a run cut short by
    an error or Ctrl-C still writes what it measured)."""
    order = st.arm_order(a.cycles, a.seed)
    print(f"\n== A/B: {a.cycles} cycles, arm order {' '.join(order)}; "
          + (f"open loop, Poisson {a.open_loop:g} requests/s over {sum(a.phase_s):g} s per cycle"
             if a.open_loop else f"closed loop, load 1 for {a.phase_s[0]:g} s then {a.concurrency} for "
                                 f"{a.phase_s[1]:g} s per cycle"), flush=True)
    print(f"   schedule {brief(schedule_cfg)}; fixed steps {fixed_steps}; acceptance-only "
          f"{brief(adaptive_policy.config_json(adaptive_policy.default_config()))} (SGLang's default tiers)",
          flush=True)
    ol = offsets = None
    if a.open_loop:
        from open_loop import OpenLoop
        ol = OpenLoop(b.url, b.prompts, b.max_new_tokens)
        offsets = st.poisson_arrivals(a.open_loop, sum(a.phase_s), a.seed)
    cycles = [] if cycles is None else cycles
    cut = None
    first = len(b.records)
    try:
        for arm in st.ARMS:           # warm-up: graphs, caches and the policy see every arm once
            b.apply(arm_changes(arm, schedule_cfg, fixed_steps))
            closed_cycle(b, a, (a.warmup_s, a.warmup_s), measure=False)
        b.set_load(0)
        cycle_s = sum(a.phase_s) + 4.0
        for i, arm in enumerate(order):
            if time.time() + cycle_s > deadline:
                cut = f"stopped before cycle {i + 1} of {a.cycles}: --max-wall-s would be exceeded"
                print(f"   {cut}", flush=True)
                break
            b.set_load(0)
            b.apply(arm_changes(arm, schedule_cfg, fixed_steps))
            if ol is not None:
                c = {"cycle": i + 1, "arm": arm, "open": open_cycle(b, a, ol, offsets)}
            else:
                c = {"cycle": i + 1, "arm": arm, "phases": closed_cycle(b, a, a.phase_s, measure=True)}
            if b.feed.last_error and not b.healthy():   # a dead server's cycle is no arm's zeros
                raise ServerGone(b.feed.last_error)
            cycles.append(c)
            if ol is not None:
                print(f"   cycle {i + 1} {arm:<10} {len(c['open']['requests'])} requests  "
                      f"steps ran {c['open']['steps_ran']}", flush=True)
            else:
                print(f"   cycle {i + 1} {arm:<10} " + "  ".join(
                    f"load {p['load']}: {st.median_interval(p['windows'])[0]:.1f} tok/s steps {p['steps_ran']}"
                    for p in c["phases"]), flush=True)
    finally:
        b.set_load(0)
        if ol is not None:
            ol.close()
    out: dict[str, Any] = {"order": order, "cycles": cycles, "cut_short": cut,
                           "schedule_config": schedule_cfg, "fixed_steps": fixed_steps,
                           "graphs": st.capture_summary(b.records[first:])}
    out.update(summarise_open(cycles) if a.open_loop else summarise_closed(cycles, a))
    return out


def summarise_closed(cycles: list[dict], a) -> dict[str, Any]:
    loads = (1, a.concurrency)
    # Each arm's windows stay grouped by cycle: the intervals resample cycles, then windows (a cycle's
    # windows share the host's state; run 4 on CPU read a same-steps phase "wholly below 1.0" from
    # windows resampled as if independent while the arms' cycles overlapped).
    wins: dict[str, dict[int, list[list[float]]]] = {arm: {ld: [] for ld in loads} for arm in st.ARMS}
    ran: dict[str, dict[int, Counter]] = {arm: {ld: Counter() for ld in loads} for arm in st.ARMS}
    for c in cycles:
        for p in c["phases"]:
            wins[c["arm"]][p["load"]].append(list(p["windows"]))
            ran[c["arm"]][p["load"]].update({int(k): v for k, v in p["steps_ran"].items()})
    arms = {arm: {str(ld): {"tok_s": st.median_interval_by_cycle(wins[arm][ld]),
                            "windows": sum(len(w) for w in wins[arm][ld]),
                            "steps_ran": {str(k): v for k, v in sorted(ran[arm][ld].items())}}
                  for ld in loads} for arm in st.ARMS}
    weights = {1: a.phase_s[0], a.concurrency: a.phase_s[1]}
    ratios = {other: {ld: st.ratio_by_cycle(wins["schedule"][ld], wins[other][ld]) for ld in loads}
              for other in ("fixed", "acceptance")}
    twm = {other: st.time_weighted({ld: r[0] for ld, r in per.items()}, weights) for other, per in ratios.items()}
    # Where the schedule and another arm ran the very same steps, their ratio is the host's noise:
    # the goal reads it as 1.0 (a noisy 1.2 there is no gain, a noisy 0.8 no loss).
    same = {other: [ld for ld in loads if ran["schedule"][ld] and set(ran["schedule"][ld]) == set(ran[other][ld])]
            for other in ("fixed", "acceptance")}
    counted = st.same_steps_as_one(ratios, same)
    twc = {other: st.time_weighted({ld: r[0] for ld, r in per.items()}, weights) for other, per in counted.items()}
    g = st.goal(counted, weights, sum(1 for _ in cycles))
    return {"arms": arms, "same_steps_loads": {o: [str(ld) for ld in lds] for o, lds in same.items()},
            "weights": {str(k): v for k, v in weights.items()},
            "ratios": {o: {str(ld): r for ld, r in per.items()} for o, per in ratios.items()},
            "time_weighted": twm, "time_weighted_same_steps_as_one": twc,
            "goal": {"passed": g.passed, "why": g.why}}


def summarise_open(cycles: list[dict]) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in st.ARMS:
        reqs = [r for c in cycles if c["arm"] == arm for r in c["open"]["requests"]]
        ok = [r for r in reqs if r["error"] is None and r["done"] is not None]
        tpot = [(r["done"] - r["first"]) / (r["tokens"] - 1) * 1e3 for r in ok if r["tokens"] > 1]
        e2e = [(r["done"] - r["sent"]) for r in ok]
        win = [w for c in cycles if c["arm"] == arm for w in c["open"]["windows"]]
        arms[arm] = {"requests": len(reqs), "errors": len(reqs) - len(ok), "tok_s": st.median_interval(win),
                     "tpot_ms_p50": st.percentile(tpot, 50), "tpot_ms_p99": st.percentile(tpot, 99),
                     "e2e_s_p50": st.percentile(e2e, 50), "e2e_s_p99": st.percentile(e2e, 99)}
    return {"arms": arms}


def print_ab(res: dict[str, Any], a) -> None:
    if a.open_loop:
        print(f"\n== open loop, Poisson {a.open_loop:g} requests/s: per arm")
        print("   arm              requests  errors  tok/s [95 %]                 TPOT p50/p99 ms   e2e p50/p99 s")
        for arm, r in res["arms"].items():
            m, lo, hi = r["tok_s"]
            print(f"   {st.ARM_TITLES[arm]:<16} {r['requests']:8d} {r['errors']:7d}  {m:8.1f} [{lo:7.1f}, {hi:7.1f}]"
                  f"      {r['tpot_ms_p50']:7.1f} / {r['tpot_ms_p99']:7.1f}   {r['e2e_s_p50']:6.2f} / "
                  f"{r['e2e_s_p99']:6.2f}")
        return
    loads = list(res["weights"])
    print("\n== tok/s per load phase (median of settled 1-s windows, 95 % bootstrap interval over cycles, then windows)")
    print("   arm              " + "".join(f"{'load ' + ld:>34}" for ld in loads))
    for arm, per in res["arms"].items():
        cells = []
        for ld in loads:
            m, lo, hi = per[ld]["tok_s"]
            cells.append(f"{m:9.1f} [{lo:8.1f}, {hi:8.1f}] n={per[ld]['windows']:<3d}")
        print(f"   {st.ARM_TITLES[arm]:<16} " + "".join(f"{c:>34}" for c in cells))
    print("   steps that ran:  " + "; ".join(
        f"{st.ARM_TITLES[arm]} " + " / ".join(json.dumps(per[ld]['steps_ran']) for ld in loads)
        for arm, per in res["arms"].items()))
    w = res["weights"]
    print(f"\n== ratios per load phase (95 % bootstrap over cycles, then windows), time-weighted over {' / '.join(f'{v:g} s at {k}' for k, v in w.items())}")
    for other, per in res["ratios"].items():
        cells = "  ".join(f"load {ld}: {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]" for ld, r in per.items())
        print(f"   schedule/{st.ARM_TITLES[other]:<16} {cells}   time-weighted {res['time_weighted'][other]:.3f}")
    for other, lds in res.get("same_steps_loads", {}).items():
        for ld in lds:
            print(f"   at load {ld} the schedule and {st.ARM_TITLES[other]} ran the same steps "
                  f"{sorted(res['arms']['schedule'][ld]['steps_ran'])}: that ratio measures the host's noise, "
                  f"not the schedule")
        if lds and "time_weighted_same_steps_as_one" in res:
            print(f"   schedule/{st.ARM_TITLES[other]}: time-weighted with those phases read as 1.0 "
                  f"{res['time_weighted_same_steps_as_one'][other]:.3f} (the goal reads them so)")
    if res.get("bests_coincide"):
        print("   (the buckets' bests coincided: the schedule ran one setting everywhere, the same as a fixed "
              "one, so schedule/fixed near 1.0 is by construction)")
    print_graphs(res.get("graphs"))
    g = res["goal"]
    print(f"\n   goal (>= {st.GOAL_RATIO} time-weighted against each arm, phases where both ran the same steps "
          f"read as 1.0, no phase wholly below 1.0): "
          f"{'PASS' if g['passed'] else 'MISS'}: {g['why']}", flush=True)


# -- the command -------------------------------------------------------------------------------------
def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", default="cpu", choices=tuple(DEVICE_DEFAULTS))
    p.add_argument("--model-path", default=None, help="a preset (dummy weights) or a checkpoint directory")
    p.add_argument("--concurrency", "-C", type=int, default=None, help="the high load (16 on CPU, 64 on CUDA)")
    p.add_argument("--buckets", default=None, help="sweep loads, comma-separated (default 1,C; e.g. 1,4,16)")
    p.add_argument("--steps", default="0,1,2,3,4,5,6,7", help="candidate chain settings (0 = tier 0)")
    p.add_argument("--sweep-s", type=float, default=4.0, help="measured seconds per sweep point after settling")
    p.add_argument("--sweep-repeats", type=int, default=1, help="sweep passes (windows pooled; 2+ on a noisy host)")
    p.add_argument("--settle-s", type=float, default=W.SETTLE_S, help="seconds a switch settles (and 20 iterations)")
    p.add_argument("--phase-s", default="20", help="seconds per load phase: S, or S1,SC")
    p.add_argument("--cycles", type=int, default=6, help="A/B cycles (1 then C), one arm each; a multiple of 3")
    p.add_argument("--warmup-s", type=float, default=3.0, help="seconds per phase of each arm's warm-up cycle")
    p.add_argument("--open-loop", type=float, default=None, metavar="RATE",
                   help="Poisson arrivals at RATE requests/s instead of the closed loop")
    p.add_argument("--max-new-tokens", type=int, default=None, help="mean output length (128 on CPU, 256 on CUDA)")
    p.add_argument("--length-spread", type=float, default=0.5, metavar="F",
                   help="output lengths uniform in [(1-F) N, (1+F) N], seeded (0: every request N tokens, "
                        "the script of the results before it existed)")
    p.add_argument("--accept-by-load", default=None, metavar="L=W,...",
                   help="each load's workload, as published acceptance (EAGLE-3 paper, L3.1-8B, T=1): "
                        "e.g. 1=mtbench,256=humaneval; a load not named keeps the launch's curve")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=("sweep", "ab"), default=None)
    p.add_argument("--table", default=None, help="with --only ab: the JSON written by --only sweep")
    p.add_argument("--from-tune", default=None, metavar="FILE", help="the schedule from tune --schedule --json")
    p.add_argument("--fixed", type=int, default=None, metavar="STEPS", help="the fixed arm's steps (skips the sweep)")
    p.add_argument("--max-wall-s", type=float, default=None, help="refuse a longer plan (0: no limit)")
    p.add_argument("--server-arg", action="append", default=[], dest="server_args",
                   help="one more argument for serve (repeatable), e.g. --server-arg=--enable-torch-compile")
    p.add_argument("--json", default=None, metavar="OUT", help="write everything as JSON")
    a = p.parse_args(argv)
    model, conc, max_new, wall, startup = DEVICE_DEFAULTS[a.device]
    a.model_path = a.model_path or model
    a.concurrency = a.concurrency or conc
    a.max_new_tokens = a.max_new_tokens or max_new
    a.max_wall_s = wall if a.max_wall_s is None else a.max_wall_s
    a.startup_s = startup
    try:
        a.steps = sorted({int(x) for x in a.steps.split(",") if x.strip()})
        a.buckets = sorted({int(x) for x in (a.buckets or f"1,{a.concurrency}").split(",") if x.strip()})
    except ValueError:
        raise st.PlanError("--steps and --buckets take comma-separated whole numbers") from None
    if not 0.0 <= a.length_spread < 1.0:
        raise st.PlanError("--length-spread must be in [0, 1)")
    if a.sweep_repeats < 1:
        raise st.PlanError("--sweep-repeats must be >= 1")
    if a.concurrency < 2 or not a.steps or min(a.steps) < 0 or max(a.steps) > len(published_curve()):
        raise st.PlanError(f"--concurrency must be >= 2 and --steps within 0..{len(published_curve())} "
                           f"(the simulated curve's length)")
    if a.buckets[0] != 1 or a.concurrency not in a.buckets:
        raise st.PlanError(f"--buckets must include 1 and --concurrency {a.concurrency}, got {a.buckets}")
    a.phase_s = st.phase_seconds(a.phase_s)
    a.workloads = accept_by_load(a.accept_by_load)
    if a.workloads and a.open_loop is not None:
        raise st.PlanError("--accept-by-load runs a closed loop per load: it does not combine with --open-loop")
    if set(a.workloads) - set(a.buckets):
        raise st.PlanError(f"--accept-by-load names loads outside the buckets {a.buckets}")
    if a.open_loop is not None:
        st.poisson_arrivals(a.open_loop, 1.0, 0)          # the rate's check
    if a.only == "ab" and not (a.table or (a.from_tune and a.fixed is not None)):
        raise st.PlanError("--only ab needs --table FILE (from --only sweep), or --from-tune FILE with --fixed STEPS")
    if a.only == "sweep" and (a.table or a.fixed is not None):
        raise st.PlanError("--only sweep measures the table: --table and --fixed belong to --only ab")
    if a.only != "sweep":
        st.arm_order(a.cycles, a.seed)                     # the cycles' check
    return a


def read_json(path: str, what: str) -> Any:
    """FILE, or FILE#RUN: a run of a folded results file (benchmarks/folded.py)."""
    try:
        return folded.read(path)
    except folded.FoldedError as e:
        raise st.PlanError(f"{what} {e}") from None


def table_from(path: str, a) -> dict[str, Any]:
    obj = read_json(path, "--table")
    sw = obj.get("sweep") if isinstance(obj, dict) else None
    if not isinstance(sw, dict) or not all(k in sw for k in ("bests", "best_fixed", "schedule_config", "buckets")):
        raise st.PlanError(f"--table {path}: no sweep table in it (write one with --only sweep --json FILE)")
    if a.concurrency not in sw["buckets"]:
        raise st.PlanError(f"--table {path}: its buckets {sw['buckets']} do not include --concurrency {a.concurrency}")
    return sw


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse(argv)
        tune = st.from_tune(read_json(a.from_tune, "--from-tune")) if a.from_tune else None
        table = table_from(a.table, a) if a.table else None
    except st.PlanError as e:
        print(f"schedule_ab: {e}", file=sys.stderr)
        return 2
    run_sweep = a.only != "ab" and table is None and not (tune and a.fixed is not None)
    run_ab = a.only != "sweep"
    plan = st.Plan(sweep_points=len(a.buckets) * len(a.steps) * a.sweep_repeats if run_sweep else 0, sweep_s=a.sweep_s,
                   settle_s=a.settle_s, cycles=a.cycles if run_ab else 0, phase_s=a.phase_s,
                   warmup_s=a.warmup_s, startup_s=a.startup_s, drain_s=10.0 if a.open_loop else 0.0,
                   capture_s=3.0 if a.device == "cuda" else 0.0)
    try:
        est = st.check_plan(plan, a.max_wall_s)
    except st.PlanError as e:
        print(f"schedule_ab: {e}", file=sys.stderr)
        return 2
    t_start = time.time()
    deadline = t_start + (a.max_wall_s or math.inf) - 15.0
    args = serve_args(a)
    # On a shared CPU host a rank's OpenMP threads must not spin while waiting for each other (one
    # of them is often descheduled): passive waiting unless the caller's environment says otherwise,
    # recorded with the result.
    omp = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")} if a.device == "cpu" else {}
    serve_env = {**base_env(), **omp}
    report: dict[str, Any] = {
        "command": "python benchmarks/schedule_ab.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])),
        "device": a.device, "model_path": a.model_path, "concurrency": a.concurrency, "curve": published_curve(),
        "workloads": {str(load): {"name": w, "paper_tau_t1": PAPER_TAU_T1[w], "curve": workload_curve(w)}
                      for load, w in a.workloads.items()},
        "serve": " ".join(shlex.quote(x) for x in args), "serve_env": serve_env, "estimate_s": est,
        "host": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()}}
    print(f"# schedule_ab: {a.model_path} on {a.device}, load 1 <-> {a.concurrency}, simulated 8B curve{(' and per load ' + str(a.workloads)) if a.workloads else ''}; "
          f"about {est / 60:.1f} min (limit {a.max_wall_s:g} s); host: {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"# serve {report['serve']}", flush=True)

    def save() -> None:
        if a.json:
            report["host"]["loadavg_after"] = os.getloadavg()
            report["wall_s"] = time.time() - t_start
            Path(a.json).write_text(json.dumps(report, indent=1, default=str) + "\n")

    import httpx

    from tuner.engine_process import EngineProcess, EngineStartError
    # SIGTERM ends this script through its finally blocks, so the server never outlives it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        engine = EngineProcess.start(args, env={"PYTHONPATH": str(ROOT), **serve_env}, timeout_s=900, cwd=ROOT,
                                     die_with_parent=True)
    except EngineStartError as e:
        last = (e.log_tail.strip().splitlines() or [""])[-1]
        print(f"schedule_ab: the server did not start: {e}: {last}".splitlines()[0], file=sys.stderr)
        return 1
    b = None
    try:
        vocab = 128
        with httpx.Client(base_url=engine.url, trust_env=False, timeout=30) as h:
            vocab = int(h.get("/model_info").json().get("vocab_size") or vocab)
        base = prompts_for(a.seed, vocab, max_new_tokens=a.max_new_tokens, spread=a.length_spread)
        b = Bench(engine.url, base, a.max_new_tokens,
                  {load: with_curve(base, workload_curve(w)) for load, w in a.workloads.items()})
        if table is None and run_sweep:
            table = sweep(b, a)
            report["sweep"] = table
            print_sweep(table)
            save()
        if not run_ab:
            return 0
        if tune is not None:
            bests, schedule_cfg = tune
            report["from_tune"] = {"bests": bests, "adaptive_config": schedule_cfg}
            print_bests({str(k): v for k, v in bests.items()}, f"tune --schedule, {a.from_tune}")
        else:
            schedule_cfg = table["schedule_config"]
            if a.table:
                print_bests(table["bests"], f"the sweep, {a.table}")
        fixed = a.fixed if a.fixed is not None else table["best_fixed"]["steps"]
        report["ab_cycles_so_far"] = done = []
        res = ab(b, a, schedule_cfg, fixed, deadline, done)
        del report["ab_cycles_so_far"]
        res["bests_coincide"] = st.bests_coincide(tune[0] if tune is not None
                                                  else {int(k): v for k, v in table["bests"].items()})
        report["ab"] = res
        print_ab(res, a)
        save()
        print(f"\n# command: {report['command']}\n# wall {time.time() - t_start:.0f} s (estimated {est:.0f}); "
              f"load average now {os.getloadavg()[0]:.1f}; load errors {b.load_errors}", flush=True)
        return 0
    except st.PlanError as e:
        print(f"schedule_ab: {e}", file=sys.stderr)
        save()
        return 1
    except (httpx.HTTPError, ServerGone) as e:
        why = engine.log_tail(1).strip() if not engine.alive() else ""
        print(f"schedule_ab: the server stopped answering ({type(e).__name__}: {e}){': ' + why if why else ''}; "
              f"what was measured is in {a.json or 'nothing (no --json)'}".splitlines()[0], file=sys.stderr)
        save()
        return 1
    except KeyboardInterrupt:
        print(f"schedule_ab: interrupted; what was measured is in {a.json or 'nothing (no --json)'}", file=sys.stderr)
        save()
        return 130
    finally:
        if b is not None:
            b.close()
        engine.stop(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
