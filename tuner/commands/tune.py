"""`specdecode-tune tune URL [--budget D] [--apply] [--out FILE]`: headless live tuning
(`--schedule`: per batch size over a load sweep, tuner.commands.tune_schedule).

Keeps load on the server (unless --load 0), runs the live tuner (tuner.tuning.live) on the headless
driver, prints each step in tuner.core.event_text's words, then the readout (tuner.tuning.summary).
Without --apply the server is put back as it was; --out records everything, as `record` does.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

from tuner.commands.duration import parse_duration
from tuner.commands.options import (MAX_STEPS_BOUND, OpenError, add_load_arguments, add_objective_arguments,
                                    add_server_arguments, fail, int_list, objective_of, open_session, placement_list,
                                    prompts_for)
from tuner.commands.tune_schedule import SCHEDULE_PLACEMENTS, add_schedule_arguments, run_schedule, schedule_problem
from tuner.core.driver import Driver
from tuner.core import setting as vocab
from tuner.core.event_text import event_text
from tuner.core.events import TUNING_PREFIX, TuningKind
from tuner.core.records import Event, thaw
from tuner.core.text import terminal_safe
from tuner.recording.outputs import OutputError, unwritable_output, write_text
from tuner.tuning.settings import steps_left_out, tune_space
from tuner.tuning.summary import summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    parser.add_argument("--budget", default="5m", help="time the tuner may take (e.g. 90s, 5m; default 5m)")
    parser.add_argument("--apply", action="store_true",
                        help="leave the best setting applied (default: restore the starting setting)")
    parser.add_argument("--out", type=Path, default=None, help="record the session into this file")
    parser.add_argument("--json", type=Path, default=None, dest="json_out",
                        help="write the result (predictions, fitted model, flags) as JSON")
    parser.add_argument("--max-steps", type=int, default=7, help="deepest chain to consider (default 7)")
    parser.add_argument("--topk", type=int_list, default=[1],
                        help="topk values to consider, e.g. 1,4 (chains, topk 1, always are; trees need --draft-tokens)")
    parser.add_argument("--draft-tokens", type=int_list, default=[],
                        help="num_draft_tokens values for trees, e.g. 8,16")
    parser.add_argument("--placements", type=placement_list, default=None,
                        help="draft placements to consider (default: every one the server can set live; "
                             "with --schedule: sharded)")
    parser.add_argument("--no-off", action="store_true", help="do not consider tier 0 (steps 0, draft kept warm)")
    add_objective_arguments(parser)
    add_schedule_arguments(parser)
    add_load_arguments(parser, tui=False)      # headless: no l key
    parser.set_defaults(load=4)


def _say(line: str) -> None:
    print(terminal_safe(line, keep_newlines=True), flush=True)


def say_event(e: Event) -> None:
    """A tuning event as a line of its own (tuner.core.event_text's words); its findings indented
    under the decisions. The finish is the summary that follows."""
    if not e.kind.startswith(TUNING_PREFIX) or e.kind == TuningKind.FINISHED:
        return
    said = event_text(e.kind, thaw(e.data))
    if said is not None:
        _say(("" if e.kind in (TuningKind.STARTED, TuningKind.APPLIED) else "  ") + said.text)


def run(args: argparse.Namespace) -> int:
    try:
        budget = parse_duration(args.budget)
        prompts = prompts_for(args) if args.load > 0 else []
        args.objective_obj = objective_of(args)      # SloError is a ValueError: one line, status 2
    except (OSError, ValueError) as e:
        return fail("tune", e, 2)
    trees = any(k > 1 for k in args.topk) and not args.draft_tokens and "trees (--topk > 1) need --draft-tokens"
    deep = not 1 <= args.max_steps <= MAX_STEPS_BOUND and f"--max-steps must be between 1 and {MAX_STEPS_BOUND}"
    if deep or schedule_problem(args) or trees:
        return fail("tune", deep or schedule_problem(args) or trees, 2)
    unwritable = unwritable_output({"--json": args.json_out, "--adaptive-config": args.adaptive_config})
    if unwritable:      # before tuning: a result that cannot be written must not cost the whole budget
        return fail("tune", unwritable, 2)
    try:
        with open_session(args, record=args.out, header={"command": "tune"}, start=True) as opened:
            rc = _tune(args, opened, budget, prompts)
    except OpenError as e:
        return fail("tune", e)
    if rc == 0 and args.out is not None:
        _say(f"recorded to {args.out}")
    return rc


def _tune(args: argparse.Namespace, opened, budget: float, prompts: list[dict]) -> int:
    from tuner.tuning.live import InlineRunner, Tuner, TunerOptions, TuningError

    backend, session = opened.backend, opened.session
    driver = Driver(session, on_event=say_event)
    placements = args.placements or (SCHEDULE_PLACEMENTS if args.schedule else None)
    caps = backend.capabilities          # on SGLang: steps this launch cannot pin are said, with the fix
    space = tune_space(lambda arg: backend.why_not(arg) is None, args.max_steps, args.topk, args.draft_tokens,
                       placements, include_off=not args.no_off, steps_allowed=caps.allowed_values(vocab.STEPS))
    try:
        if args.schedule:
            return run_schedule(args, backend, session, driver, space, prompts, budget, _say)
        tuner = Tuner(session, space, TunerOptions(budget_s=budget, apply_best=args.apply,
                                                   objective=args.objective_obj), runner=InlineRunner())
        if args.load > 0:
            session.start_load(prompts, args.load, args.max_new_tokens)
        _say(f"tuning {args.url} ({backend.kind}); load: "
             + (f"Poisson arrivals of {args.rate:g} requests/s, at most {args.load} in flight" if args.rate
                else f"{args.load} requests in flight" if args.load else "the server's own traffic")
             + "".join(f"\n{n}" for n in [steps_left_out(caps, args.max_steps)] if n)
             + ("" if args.objective_obj.plain else f"\nobjective: {args.objective_obj.describe()}"))
        driver.start_tuner(tuner)
        for ctrl_c in (1, 2):     # the first cancels the tuner, which puts the server back; the second quits
            try:
                driver.run(threading.Event(), until=lambda: not driver.tuner_running())
                break
            except KeyboardInterrupt:
                if ctrl_c == 2:
                    raise
                _say("interrupted: putting the server back and summarising (Ctrl-C again to quit at once)")
                driver.cancel_tuner()
        if tuner.result is None:
            return fail("tune", tuner.status, 1)
        doc = tuner.result.to_json()
        _say("")
        lines = summary(doc)
        for line in lines:
            _say(line)
        from tuner.tuning.comm_whatif import session_remedies
        for line in session_remedies(session):      # what else this server lets you change
            _say(f"remedy: {line}")
        _say(lines[0])          # the outcome again, last: the table and costs scroll it away
        if args.json_out is not None:
            try:
                write_text(args.json_out, json.dumps(doc, indent=1) + "\n")
                _say(f"result written to {args.json_out}")
            except OutputError as e:
                return fail("tune", f"--json: {e}", 1)
        return 0
    except TuningError as e:          # the tuner cannot run against this server
        return fail("tune", e, 1)
    except KeyboardInterrupt:
        return 130
    finally:
        driver.close()

