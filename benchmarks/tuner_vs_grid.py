"""The tuner against the exhaustive grid on the same live server.

    python benchmarks/tuner_vs_grid.py [--emulate-comm-latency 3000] [--repeats 3] [--out FILE]

Starts `python -m refengine serve` (TP 2 on CPU by default), keeps `--load` generate requests in
flight, then
  1. measures every setting of the space `--repeats` times in shuffled order (live switching, the
     same settle rule and 1-s tok/s windows the A/B uses), which gives each setting's tok/s, the
     grid's own noise (median relative spread across repeats) and the grid's best;
  2. restores the starting setting and runs the live tuner (tuner.tuning.live) on the same server.
It prints, side by side: the time until the tuner first proposed a setting whose grid tok/s is within
max(2 %, grid noise) of the grid's best, as a fraction of one grid pass's wall time (goal ≤ 25 %);
the tuner's final choice against the grid (within that target or not); and what an acceptance-only
policy (SGLang's adaptive steps, which never moves the draft off the TP group) would run, with its
grid tok/s. Each scenario records the host's load average before and after.

    python benchmarks/tuner_vs_grid.py --summarise benchmarks/results/tuner_vs_grid_cpu_2core.json

prints the median and range over several runs (the figures move with the host's load): the runs of
a series file, or of several run files. `--out FILE` adds the run to FILE's series
(benchmarks/folded.py), so repeated runs of one question stay one file.

    python benchmarks/tuner_vs_grid.py --head-to-head 4:replicated,5:replicated --repeats 8 \
        --emulate-comm-latency 3000

alternates two settings (A B B A ...), each reading the grid's own, with its server-side busy rate:
whether a near tie the grid decided is a difference or the instrument's noise.
    python benchmarks/tuner_vs_grid.py --tune-runs 5 --budget 60 --emulate-comm-latency none

runs the tuner 5 times on one server under the same load (each from the start setting), then one
grid: does the tuner give the same answer twice? A run passes when its pick's grid tok/s lies inside
the 95 % interval (t over the grid's passes) of the grid's best setting; the goal is 4 of 5.
Nothing here asserts a time: the figures are the result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (puts this checkout on sys.path)

import folded  # noqa: E402

from tuner.backends import connect  # noqa: E402
from tuner.commands.attach import builtin_prompts  # noqa: E402
from tuner.core import ab as core_ab  # noqa: E402
from tuner.core.records import thaw  # noqa: E402
from tuner.core.session import Session  # noqa: E402
from tuner.engine_process import EngineProcess, serve_command  # noqa: E402
from tuner.tuning.live import InlineRunner, Tuner, TunerOptions, active_epoch  # noqa: E402
from tuner.tuning.observations import parse_record  # noqa: E402
from tuner.tuning.phase_feed import HttpPhaseFeed  # noqa: E402
from tuner.tuning.settings import Setting, settings_space  # noqa: E402


def shipped_model_args() -> list[str]:
    """The shipped tiny model when it is in the tree, else the agreeing random-weight preset."""
    tiny = ROOT / "refengine" / "data" / "tiny"
    if (tiny / "target" / "model.safetensors").exists() and (tiny / "eagle3" / "model.safetensors").exists():
        return ["--model-path", str(tiny / "target"), "--speculative-draft-model-path", str(tiny / "eagle3")]
    return ["--model-path", "tiny-agreeing", "--load-format", "dummy"]


class Driver:
    """Ticks the session while waiting, so the store keeps filling."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def wait(self, seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            self.session.tick()
            time.sleep(0.05)
        self.session.tick()


def measure(session: Session, feed: HttpPhaseFeed, drv: Driver, s: Setting, measure_s: float,
            settle_s: float = 2.0, settle_iters: int = 20, timeout_s: float = 120.0) -> dict:
    """Apply s, settle like the A/B does, then median of 1-s tok/s windows over measure_s."""
    res = session.set_config(s.as_server_args(), by="grid")
    if not res.ok:
        return {"setting": s.to_json(), "error": res.reason}
    epoch = active_epoch(res.active)
    feed.poll()
    first_t, seen, settled_at = math.nan, 0, math.nan
    committed, wall = 0, 0.0
    start = time.time()
    while True:
        drv.wait(0.1)
        for rec in feed.poll():
            try:
                it = parse_record(rec)
            except ValueError:
                continue
            if (epoch is not None and it.epoch != epoch) or (epoch is None and it.setting != s):
                continue
            if seen == 0:
                first_t = it.t
            seen += 1
            if math.isnan(settled_at):
                if seen > settle_iters and it.t - first_t >= settle_s:
                    settled_at = session.now()
            else:
                committed += it.committed
                wall += it.wall_ms
        if not math.isnan(settled_at) and session.now() >= settled_at + measure_s:
            break
        if time.time() - start > timeout_s:
            return {"setting": s.to_json(), "error": "no iterations (is the load running?)"}
    windows = core_ab.window_means(session.store, session.throughput_series(), settled_at,
                                   settled_at + measure_s)
    return {"setting": s.to_json(), "tok_s": statistics.median(windows) if windows else math.nan,
            "windows": len(windows), "phase_tok_s": 1000.0 * committed / wall if wall else math.nan}


def run_grid(session, feed, drv, space, repeats, measure_s, seed=0) -> tuple[dict, float, dict]:
    """Each setting measured once per pass: (client tok/s runs, wall, server-side phase tok/s runs)."""
    rng = random.Random(seed)
    runs: dict[Setting, list[float]] = {s: [] for s in space}
    phase_runs: dict[Setting, list[float]] = {s: [] for s in space}
    t0 = time.time()
    for r in range(repeats):
        order = list(space)
        rng.shuffle(order)
        for s in order:
            m = measure(session, feed, drv, s, measure_s)
            if "error" in m:
                print(f"  grid: {s.label()}: {m['error']}", flush=True)
                continue
            runs[s].append(m["tok_s"])
            phase_runs[s].append(m["phase_tok_s"])
            print(f"  grid pass {r + 1}: {s.label():<28} {m['tok_s']:8.1f} tok/s "
                  f"(phase {m['phase_tok_s']:.1f})", flush=True)
    return runs, time.time() - t0, phase_runs


def reading_noise(runs: dict, phase_runs: dict) -> dict:
    """How the grid's client-side readings scatter around the server-side ones of the same
    measurement. The server-side figure is committed tokens over busy time, which a throughput can
    never exceed: a client reading above it by more than a few per cent is the instrument's noise
    (median of a few 1-s windows of bursty token arrivals), not the setting's speed."""
    pairs = [(c, p) for s in runs for c, p in zip(runs[s], phase_runs.get(s, ())) if p and math.isfinite(p)
             and math.isfinite(c)]
    ratios = [c / p for c, p in pairs]
    if len(ratios) < 2:
        return {"readings": len(ratios)}
    return {"readings": len(ratios), "client_over_phase_median": statistics.median(ratios),
            "client_over_phase_stdev": statistics.pstdev(ratios),
            "above_phase_by_5pct": sum(r > 1.05 for r in ratios), "below_phase_by_5pct": sum(r < 0.95 for r in ratios)}


def run_tuner(session, drv, space, budget_s, start: Setting) -> tuple[Tuner, float, list]:
    res = session.set_config(start.as_server_args(), by="benchmark")
    if not res.ok:
        raise RuntimeError(f"cannot set the starting setting: {res.reason}")
    drv.wait(3.0)
    tuner = Tuner(session, space, TunerOptions(budget_s=budget_s, apply_best=True),
                  runner=InlineRunner())
    t0 = session.now()
    tuner.start()
    while tuner.step():
        drv.wait(0.1)
    drv.wait(0.2)
    events = [(e.t - t0, e.kind, thaw(e.data)) for e in session.store.events()
              if e.kind.startswith("tuning_") and e.t >= t0]
    tuner.close()
    return tuner, session.now() - t0, events


def serve_args_of(args, emulate: str | None) -> list[str]:
    """`serve`'s arguments for every mode of this script: TP on CPU or CUDA, the load's slots."""
    return (["--tp-size", str(args.tp_size), "--device", args.device, "--host", "127.0.0.1", "--port", "0",
             "--max-running-requests", str(args.load), "--speculative-num-steps", str(args.start_steps),
             *shipped_model_args(), *args.server_args] + (["--emulate-comm-latency", emulate] if emulate else []))


T975 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36}


def settle_runs(args, emulate: str | None) -> dict:
    """--tune-runs: the tuner N times, then one grid over the same server and load."""
    serve_args = serve_args_of(args, emulate)
    log = Path(tempfile.mkdtemp(prefix="tuner-bench-")) / "server.log"
    print(f"== {args.tune_runs} tune runs then one grid: {' '.join(serve_command(serve_args)[1:])}", flush=True)
    engine = EngineProcess.start(serve_args, log_path=log, timeout_s=300.0, cwd=ROOT)
    try:
        session = Session(connect(engine.url)).start()
        drv = Driver(session)
        session.start_load(builtin_prompts(), args.load, args.max_new_tokens)
        feed = HttpPhaseFeed(engine.url)
        drv.wait(5.0)
        space = settings_space(args.max_steps, placements=args.placements)
        picks = []
        for i in range(args.tune_runs):
            tuner, wall, _ = run_tuner(session, drv, space, args.budget, Setting(args.start_steps))
            res = tuner.result
            picks.append({"run": i, "best": res.best.to_json() if res else None, "wall_s": round(wall, 1),
                          "stop": res.stop_reason if res else tuner.status,
                          "verifications": [v.verdict for v in res.verifications] if res else []})
            print(f"  tune run {i + 1}: {res.best.label() if res else tuner.status} ({wall:.0f} s; "
                  f"{picks[-1]['stop']})", flush=True)
        runs, grid_wall, phase_runs = run_grid(session, feed, drv, space, args.repeats, args.measure_s)
        means = {s: statistics.mean(v) for s, v in runs.items() if v}
        best = max(means, key=means.get)
        b = runs[best]
        half = T975.get(len(b), 1.96) * statistics.stdev(b) / math.sqrt(len(b)) if len(b) >= 2 else math.nan
        lo = means[best] - half
        for pk in picks:
            s = Setting.from_json(pk["best"]) if pk["best"] else None
            pk["grid_tok_s"] = means.get(s) if s else None
            pk["inside"] = bool(s is not None and s in means and means[s] >= lo)   # unmeasured: not inside
        met = sum(pk["inside"] for pk in picks)
        feed.close()
        session.close()
        return {"emulate_comm_latency": emulate, "host": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
                "budget_s": args.budget, "space": len(space), "repeats": args.repeats,
                "grid": [{**s.to_json(), "runs": runs[s], "mean": means.get(s)} for s in space],
                "grid_best": {**best.to_json(), "tok_s": means[best], "ci95": [lo, means[best] + half]},
                "picks": picks, "inside": met, "goal_met": met >= args.tune_runs - 1}
    finally:
        engine.stop(timeout=20.0)


def scenario(args, emulate: str | None) -> dict:
    serve_args = serve_args_of(args, emulate)
    load_before = os.getloadavg()
    log = Path(tempfile.mkdtemp(prefix="tuner-bench-")) / "server.log"
    shown = " ".join(serve_command(serve_args)[1:])
    print(f"== {'slow link ' + emulate + ' us' if emulate else 'no emulated latency'}: {shown}", flush=True)
    engine = EngineProcess.start(serve_args, log_path=log, timeout_s=300.0, cwd=ROOT)
    try:
        url = engine.url
        backend = connect(url)
        session = Session(backend).start()
        drv = Driver(session)
        session.start_load(builtin_prompts(), args.load, args.max_new_tokens)
        feed = HttpPhaseFeed(url)
        drv.wait(5.0)
        space = settings_space(args.max_steps, placements=args.placements)
        runs, grid_wall, phase_runs = run_grid(session, feed, drv, space, args.repeats, args.measure_s)
        means = {s: statistics.mean(v) for s, v in runs.items() if v}
        spread = [statistics.stdev(v) / statistics.mean(v) for v in runs.values() if len(v) >= 2]
        noise = statistics.median(spread) if spread else math.nan
        grid_best = max(means, key=means.get)
        threshold = max(0.02, noise if math.isfinite(noise) else 0.0)
        good = {s for s, m in means.items() if m >= means[grid_best] * (1 - threshold)}
        one_pass = grid_wall / args.repeats

        start = Setting(args.start_steps)
        tuner, tuner_wall, events = run_tuner(session, drv, space, args.budget, start)
        reach = math.nan
        for t, kind, data in events:
            if kind in ("tuning_applied", "tuning_finished"):
                key = data["setting"] if kind == "tuning_applied" else data["best"]
                if Setting.from_json(key) in good:
                    reach = t
                    break
        res = tuner.result
        ao = res.acceptance_only if res else None
        final = means.get(res.best) if res else None
        out = {
            "host": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
            "emulate_comm_latency": emulate, "space": len(space), "repeats": args.repeats,
            "grid_wall_s": grid_wall, "grid_one_pass_s": one_pass, "grid_noise": noise,
            "threshold": threshold, "grid_best": {**grid_best.to_json(), "tok_s": means[grid_best]},
            "grid": [{**s.to_json(), "runs": runs[s], "phase_runs": phase_runs[s], "mean": means.get(s)}
                     for s in space],
            "reading_noise": reading_noise(runs, phase_runs),
            "tuner_wall_s": tuner_wall, "tuner_reach_s": reach,
            "reach_fraction_of_one_pass": reach / one_pass if math.isfinite(reach) else None,
            "reach_fraction_of_full_grid": reach / grid_wall if math.isfinite(reach) else None,
            "tuner_best": res.best.to_json() if res else None,
            "tuner_best_grid_tok_s": final,
            "tuner_best_within_target": bool(res and res.best in good),
            "tuner_best_fraction_of_grid_best": final / means[grid_best] if final else None,
            "tuner_stop": res.stop_reason if res else tuner.status,
            "acceptance_only": ao.to_json() if ao else None,
            "acceptance_only_grid_tok_s": means.get(ao) if ao else None,
            "events": [(round(t, 2), k) for t, k, _ in events],
            "result": res.to_json() if res else None,
        }
        feed.close()
        session.close()
        return out
    finally:
        engine.stop(timeout=20.0)


def report(r: dict) -> list[str]:
    link = f"slow link ({r['emulate_comm_latency']} us/collective)" if r["emulate_comm_latency"] \
        else "no emulated latency"
    gb = r["grid_best"]
    lines = [f"{link}: {r['space']} settings x {r['repeats']} repeats, grid {r['grid_wall_s']:.0f} s "
             f"({r['grid_one_pass_s']:.0f} s a pass), grid noise {r['grid_noise'] * 100:.1f} %, "
             f"target within {r['threshold'] * 100:.1f} % of the best",
             f"  grid best:   {Setting.from_json(gb).label():<28} {gb['tok_s']:.1f} tok/s"]
    if r["tuner_best"]:
        tb = Setting.from_json(r["tuner_best"])
        ratio = (r["tuner_best_grid_tok_s"] or math.nan) / gb["tok_s"]
        within = r.get("tuner_best_within_target")
        lines.append(f"  tuner chose: {tb.label():<28} {r['tuner_best_grid_tok_s'] or math.nan:.1f} tok/s "
                     f"on the grid ({ratio:.3f} of best, {'within' if within else 'NOT within'} target); "
                     f"tuner ran {r['tuner_wall_s']:.0f} s ({r['tuner_stop']})")
    if r["reach_fraction_of_one_pass"] is not None:
        lines.append(f"  time to a setting within target: {r['tuner_reach_s']:.0f} s = "
                     f"{r['reach_fraction_of_one_pass'] * 100:.0f} % of one grid pass, "
                     f"{r['reach_fraction_of_full_grid'] * 100:.0f} % of the repeated grid (goal <= 25 %)")
    else:
        lines.append("  the tuner never proposed a setting within target")
    if r["acceptance_only"]:
        ao = Setting.from_json(r["acceptance_only"])
        g = r["acceptance_only_grid_tok_s"]
        lines.append(f"  acceptance-only policy: {ao.label():<22} "
                     + (f"{g:.1f} tok/s on the grid; tuned/acceptance-only = "
                        f"{(r['tuner_best_grid_tok_s'] or math.nan) / g:.2f}" if g else "not in the grid"))
    rn = r.get("reading_noise") or {}
    if rn.get("readings", 0) >= 2:
        lines.append(f"  grid readings, client / server-side busy rate: median {rn['client_over_phase_median']:.3f}, "
                     f"spread {rn['client_over_phase_stdev'] * 100:.1f} %; {rn['above_phase_by_5pct']} of "
                     f"{rn['readings']} read over 5 % above it (instrument noise: a throughput cannot exceed "
                     f"its busy rate)")
    return lines


def summarise(paths: list[Path]) -> list[str]:
    """Median and range, per scenario, over several runs' result files."""
    by: dict[str, list[dict]] = {}
    for path in paths:
        try:
            docs = folded.runs(folded.read(path))
        except folded.FoldedError as e:
            raise SystemExit(f"tuner_vs_grid: cannot read {e}") from None
        for doc in docs:
            for r in doc.get("results", []) if isinstance(doc, dict) else []:
                by.setdefault(str(r["emulate_comm_latency"] or "none"), []).append(r)

    def spread(vals: list[float], fmt: str) -> str:
        vals = [v for v in vals if v is not None and math.isfinite(v)]
        if not vals:
            return "-"
        return f"{fmt.format(statistics.median(vals))} [{fmt.format(min(vals))}..{fmt.format(max(vals))}]"

    def frac(r: dict) -> float | None:
        got = r.get("tuner_best_grid_tok_s")
        return got / r["grid_best"]["tok_s"] if got else None

    def within(r: dict) -> bool:      # the same rule as the run's own: within max(2 %, noise)
        f = frac(r)
        return f is not None and f >= 1 - r["threshold"] - 1e-12

    lines = []
    for link, rs in by.items():
        name = "no emulated latency" if link == "none" else f"slow link ({link} us/collective)"
        reached = [r for r in rs if r["reach_fraction_of_one_pass"] is not None]
        loads = [f"{r['host']['loadavg_before'][0]:.1f}/{r['host']['loadavg_after'][0]:.1f}"
                 for r in rs if r.get("host")]
        lines += [f"{name}: {len(rs)} runs, median [min..max]",
                  f"  time to a setting within target ({len(reached)} of {len(rs)} runs reached it): "
                  f"{spread([r['tuner_reach_s'] for r in reached], '{:.1f}')} s, "
                  f"{spread([r['reach_fraction_of_one_pass'] * 100 for r in reached], '{:.0f}')} % of one "
                  f"grid pass (goal <= 25 %)",
                  f"  one grid pass: {spread([r['grid_one_pass_s'] for r in rs], '{:.0f}')} s; grid noise "
                  f"{spread([r['grid_noise'] * 100 for r in rs], '{:.1f}')} %; tuner total "
                  f"{spread([r['tuner_wall_s'] for r in rs], '{:.0f}')} s",
                  f"  final choice within target: {sum(1 for r in rs if within(r))}/{len(rs)} runs; "
                  f"fraction of the grid's best {spread([frac(r) for r in rs], '{:.3f}')}",
                  "  load average (1 min) before/after: " + (", ".join(loads) or "not recorded")]
    return lines


def parse_pair(text: str) -> tuple[Setting, Setting]:
    """'4:replicated,5:replicated' -> two chain settings (steps:placement; placement defaults to sharded)."""
    out = []
    for part in text.split(","):
        steps, _, placement = part.strip().partition(":")
        try:
            n = int(steps)
            out.append(Setting(n, 1, n + 1, placement or "sharded") if n else Setting(0))
        except ValueError as e:
            raise SystemExit(f"tuner_vs_grid: --head-to-head takes STEPS:PLACEMENT,STEPS:PLACEMENT, got {part!r} ({e})")
    if len(out) != 2 or out[0] == out[1]:
        raise SystemExit("tuner_vs_grid: --head-to-head takes two different settings")
    return out[0], out[1]


def head_to_head(args, emulate: str | None, pair: tuple[Setting, Setting]) -> dict:
    """The two settings alternated A B B A ... (`--repeats` readings each), each reading the grid's
    (settle, then the median of 1-s client windows over --measure-s) with its server-side busy rate:
    whether a near tie on the grid is a difference or the instrument's noise."""
    serve_args = serve_args_of(args, emulate)
    load_before = os.getloadavg()
    engine = EngineProcess.start(serve_args, log_path=Path(tempfile.mkdtemp(prefix="tuner-h2h-")) / "server.log",
                                 timeout_s=300.0, cwd=ROOT)
    try:
        session = Session(connect(engine.url)).start()
        drv = Driver(session)
        session.start_load(builtin_prompts(), args.load, args.max_new_tokens)
        feed = HttpPhaseFeed(engine.url)
        drv.wait(5.0)
        a, b = pair
        readings = []
        for i in range(2 * args.repeats):
            s = (a, b, b, a)[i % 4]
            m = measure(session, feed, drv, s, args.measure_s)
            readings.append({**s.to_json(), "tok_s": m.get("tok_s"), "phase_tok_s": m.get("phase_tok_s"),
                             "error": m.get("error")})
            print(f"  {i + 1:2d} {s.label():<24} client {m.get('tok_s', math.nan):6.1f}  server "
                  f"{m.get('phase_tok_s', math.nan):6.1f} tok/s", flush=True)
        feed.close()
        session.close()
    finally:
        engine.stop(timeout=20.0)
    per = {}
    for s in pair:
        mine = [r for r in readings if Setting.from_json(r) == s and r["error"] is None]
        c, p = [r["tok_s"] for r in mine], [r["phase_tok_s"] for r in mine]
        per[s.label()] = {"client_median": statistics.median(c) if c else None,
                          "server_median": statistics.median(p) if p else None,
                          "client_min": min(c) if c else None, "client_max": max(c) if c else None}
    return {"emulate_comm_latency": emulate, "pair": [s.to_json() for s in pair], "readings": readings,
            "per_setting": per, "host": {"cpus": os.cpu_count(), "loadavg_before": load_before,
                                         "loadavg_after": os.getloadavg()}}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--summarise"]:
        for line in summarise([Path(a) for a in argv[1:]]):
            print(line)
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp-size", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--emulate-comm-latency", action="append", default=None,
                   help="one scenario per value; 'none' for no emulation (default: none and 3000)")
    p.add_argument("--max-steps", type=int, default=5)
    p.add_argument("--placements", default="sharded,replicated,rank0")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--measure-s", type=float, default=3.0, help="measured seconds per grid point")
    p.add_argument("--budget", type=float, default=300.0, help="tuner budget (s)")
    p.add_argument("--load", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--start-steps", type=int, default=3, help="the server's launch steps (SGLang's default 3)")
    p.add_argument("--server-arg", action="append", default=[], dest="server_args",
                   help="extra argument for serve (repeatable)")
    p.add_argument("--out", type=Path, default=None, help="write all figures as JSON")
    p.add_argument("--tune-runs", type=int, default=0,
                   help="instead: the tuner this many times on one server, then one grid (does it settle?)")
    p.add_argument("--head-to-head", default=None, metavar="S:P,S:P",
                   help="instead of grid and tuner: alternate two settings (e.g. 4:replicated,5:replicated) "
                        "--repeats readings each, client and server-side tok/s")
    args = p.parse_args(argv)
    args.placements = [x for x in args.placements.split(",") if x]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    scenarios = args.emulate_comm_latency or ["none", "3000"]
    if args.head_to_head:
        pair = parse_pair(args.head_to_head)
        results = []
        for e in scenarios:
            print(f"== head to head, {'slow link ' + e + ' us' if e != 'none' else 'no emulated latency'}", flush=True)
            results.append(head_to_head(args, None if e == "none" else e, pair))
            for label, v in results[-1]["per_setting"].items():
                print(f"   {label:<24} client median {v['client_median']:.1f} [{v['client_min']:.1f}..{v['client_max']:.1f}]"
                      f"  server median {v['server_median']:.1f} tok/s", flush=True)
            if args.out:
                args.out.write_text(json.dumps({"argv": argv, "head_to_head": results}, indent=1, default=str) + "\n")
        return 0
    if args.tune_runs:
        for e in scenarios:
            r = settle_runs(args, None if e == "none" else e)
            print(f"grid best {Setting.from_json(r['grid_best']).label()} {r['grid_best']['tok_s']:.1f} tok/s, 95 % "
                  f"[{r['grid_best']['ci95'][0]:.1f}, {r['grid_best']['ci95'][1]:.1f}]", flush=True)
            for pk in r["picks"]:
                print(f"  run {pk['run'] + 1}: {Setting.from_json(pk['best']).label() if pk['best'] else '-'} "
                      f"grid {pk['grid_tok_s'] or float('nan'):.1f} tok/s: {'inside' if pk['inside'] else 'OUTSIDE'}",
                      flush=True)
            print(f"{r['inside']} of {len(r['picks'])} picks inside the best's interval: goal (>= "
                  f"{len(r['picks']) - 1}) {'MET' if r['goal_met'] else 'MISSED'}", flush=True)
            if args.out:
                args.out.write_text(json.dumps({"argv": argv or sys.argv[1:], "settle": r}, indent=1, default=str)
                                    + "\n")
        return 0
    results = []
    for e in scenarios:
        results.append(scenario(args, None if e == "none" else e))
        for line in report(results[-1]):
            print(line, flush=True)
        if args.out:   # after every scenario, so a run cut short keeps what it measured
            folded.append_run(args.out, {"argv": argv or sys.argv[1:], "results": results},
                              replace_last=len(results) > 1)
    print("\n== summary (command: python benchmarks/tuner_vs_grid.py " + " ".join(argv or sys.argv[1:]) + ")")
    for r in results:
        for line in report(r):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
