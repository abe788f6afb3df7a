"""`specdecode-tune tune --schedule URL`: the per-batch-size schedule, measured.

Sweeps the load (1, 2, 4, … requests in flight up to the server's max_running_requests, or
--max-load), runs the live tuner (tuner.tuning.live, one verification per load) for an equal share
of --budget at each, pools every settled iteration, fits the cost model per batch bucket
(tuner.tuning.schedule) and prints the table: bucket, best setting, predicted and measured tok/s,
stage. Then SGLang's `--speculative-adaptive-config` pinning each bucket to its tuned tier (written
to --adaptive-config FILE when given) and, with --json, the table in the shape
tuner.tuning.schedule documents. `--load 0` drives no load: the server's own traffic is bucketed
and the buckets it saw too little of are named. The server is put back to its starting setting.

This module only runs the sweep and words it; the per-bucket logic is tuner.tuning.schedule's.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from probes.names import SHARDED, STEPS
from tuner.commands.options import fail
from tuner.core.events import TuningKind

SCHEDULE_PLACEMENTS = [SHARDED]
"""A schedule's tiers are chain steps per batch size on one placement: the draft inside the TP
group, the only one SGLang has (--placements widens the table, not the export)."""


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedule", action="store_true",
                        help="tune per batch size: sweep the load 1, 2, 4, ... (--load 0: the server's own "
                             "traffic), fit each batch bucket and export SGLang's adaptive config")
    parser.add_argument("--max-load", type=int, default=None, metavar="N",
                        help="with --schedule: the highest load swept (default: the server's max_running_requests)")
    parser.add_argument("--adaptive-config", type=Path, default=None, metavar="FILE",
                        help="with --schedule: write SGLang's --speculative-adaptive-config JSON here")


def schedule_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the schedule's flags (one line), or None."""
    if args.schedule and args.apply:
        return ("--schedule leaves the server as it found it; launch with the exported adaptive config "
                "instead of --apply")
    if not args.schedule and (args.max_load is not None or args.adaptive_config is not None):
        return "--max-load and --adaptive-config need --schedule"
    if args.max_load is not None and args.max_load < 1:
        return "--max-load must be at least 1"
    return None


class ScheduleError(Exception):
    """The sweep cannot run against this server (one line for people)."""


def check_server(backend: Any) -> None:
    """Raise ScheduleError when steps cannot be changed live (SGLang without our plugin or without
    an adaptive launch: the backend's capabilities say which, in one line)."""
    caps = backend.capabilities
    active = (backend.info or {}).get("active") or {}
    if backend.kind != "sglang" and active.get("speculative_adaptive") is True:
        # Its controller would refuse every fixed step (speculative_num_steps is a 400 while adaptive).
        raise ScheduleError("this server runs its adaptive controller, which sets the steps itself: sweep a "
                            "server started without --speculative-adaptive (or send speculative_adaptive_config "
                            "null first); `record` and the TUI check the controller against the tuned schedule")
    if not caps.can_set(STEPS):
        raise ScheduleError(f"--schedule needs steps changed live: {caps.why_not(STEPS)}")
    if not caps.HAS_PHASE_STREAM:
        raise ScheduleError("--schedule needs the per-iteration phase stream (/specdecode/phases) to fit "
                            "each batch size's costs; this server has none")


def max_running(backend: Any) -> int | None:
    launch = (backend.info or {}).get("launch") or {}
    v = launch.get("max_running_requests")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def expected_batches(loads: Sequence[int], max_running_requests: int | None, max_load: int | None) -> list[int]:
    """The batch sizes whose buckets get a row even without data: the swept loads; with the server's
    own traffic (load 0), every bucket up to its max_running_requests, so the ones that traffic
    barely reached are named."""
    from tuner.tuning.schedule import loads_to_sweep

    return [x for x in loads if x] or loads_to_sweep(max_running_requests, max_load)


def sweep(args: argparse.Namespace, backend: Any, session: Any, driver: Any, space: Sequence[Any],
          prompts: list[dict], budget_s: float, say: Callable[[str], None]) -> tuple[list, list[int], list[str]]:
    """Run the tuner at each load; (settled iterations, loads swept, problems)."""
    from tuner.tuning.live import InlineRunner, Tuner, TunerOptions, TuningError
    from tuner.tuning.slo import Objective
    from tuner.tuning.schedule import loads_to_sweep

    cap = max_running(backend)
    loads = [0] if args.load == 0 else loads_to_sweep(cap, args.max_load)
    if args.load != 0 and cap is None and args.max_load is None:
        say("the server does not report max_running_requests: sweeping load 1 only (set --max-load)")
    share = budget_s / len(loads)
    iters: list = []
    problems: list[str] = []
    stop = threading.Event()
    for load in loads:
        if load:
            session.start_load(prompts, load, args.max_new_tokens)
        say(f"load {load} in flight: tuning for {share:.0f} s" if load else
            f"the server's own traffic: tuning for {share:.0f} s")
        try:
            tuner = Tuner(session, space, TunerOptions(budget_s=share, apply_best=False, max_rounds=1,
                                                       objective=getattr(args, "objective_obj", None) or Objective()),
                          runner=InlineRunner())
        except TuningError as e:
            raise ScheduleError(str(e)) from None
        t_start = session.now()
        driver.start_tuner(tuner)
        try:
            driver.run(stop, until=lambda: not driver.tuner_running())
        except KeyboardInterrupt:
            say("interrupted: putting the server back and fitting what was measured")
            driver.end_tuner()
            iters += tuner.iterations
            break
        iters += tuner.iterations
        if tuner.result is None:
            problems.append(f"load {load}: {tuner.status}")
        refused = [e for e in session.store.events(TuningKind.REFUSED, t_start, session.now() + 1)]
        if refused:
            labels = sorted({_label(e.data.get("setting")) for e in refused})
            problems.append(f"load {load}: the server refused {', '.join(labels)}"
                            + (" (an SGLang adaptive launch must capture every tier: launch --pin-steps)"
                               if backend.kind == "sglang" else ""))
        driver.release_tuner()
    session.stop_load()
    return iters, loads, problems


def run_schedule(args: argparse.Namespace, backend: Any, session: Any, driver: Any, space: Sequence[Any],
                 prompts: list[dict], budget_s: float, say: Callable[[str], None]) -> int:
    """The whole `tune --schedule`: check, sweep, fit, print, write. Returns the exit status."""
    from tuner.recording.outputs import OutputError, write_text
    from tuner.tuning.schedule import fit_schedule, table_lines

    say(f"tuning a schedule on {args.url} ({backend.kind})")

    try:
        check_server(backend)
    except ScheduleError as e:
        return fail("tune", str(e), 1)
    try:
        iters, loads, problems = sweep(args, backend, session, driver, space, prompts, budget_s, say)
    except ScheduleError as e:
        return fail("tune", str(e), 1)
    if not iters:
        return fail("tune", "no settled decode iteration at any load: "
                    + ("; ".join(problems) or "is the server serving?"), 1)
    tp = (backend.info or {}).get("tp_size")
    expected = expected_batches(loads, max_running(backend), args.max_load)
    sched = fit_schedule(iters, space, tp if isinstance(tp, int) else None, expected=expected, loads=loads)
    config_path = str(args.adaptive_config) if args.adaptive_config else "tuned-adaptive.json"
    doc = sched.to_json(config_path)
    doc["problems"] = problems
    say("")
    say(f"schedule over load {', '.join(str(x) for x in loads)} ({len(iters)} settled iterations):")
    for line in table_lines(doc):
        say(line)
    for note in [*problems, *doc["notes"]]:
        say(f"  note: {note}")
    cfg = doc["adaptive_config"]
    if cfg is None:
        say("no bucket has enough data for an SGLang adaptive config")
    else:
        say("SGLang launch: " + " ".join(doc["flags"]))
        say(f"  {config_path}: " + json.dumps(cfg))
    try:
        if args.adaptive_config is not None and cfg is not None:
            write_text(args.adaptive_config, json.dumps(cfg, indent=2) + "\n")
            say(f"adaptive config written to {args.adaptive_config}")
        if args.json_out is not None:
            write_text(args.json_out, json.dumps(doc, indent=1, allow_nan=False) + "\n")
            say(f"schedule written to {args.json_out}")
    except OutputError as e:
        return fail("tune", str(e), 1)
    return 0


def _label(setting: Any) -> str:
    from tuner.core.records import thaw
    from tuner.tuning.settings import Setting

    try:
        return Setting.from_json(thaw(setting)).label()
    except (TypeError, ValueError, KeyError):
        return "?"
