"""`specdecode-tune tune URL [--budget D] [--apply] [--out FILE]`: headless live tuning.
(`--schedule`: per batch size over a load sweep, tuner.commands.tune_schedule.)

Connects to the server, keeps load on it (unless --load 0 and the server has its own traffic),
runs the live tuner (tuner.tuning.live) to the end on the headless driver (tuner.core.driver),
prints each step in tuner.core.event_text's words and then the readout: chosen setting, the A/B
evidence, predicted vs measured tok/s, fitted costs, what an acceptance-only policy would pick,
the what-if for the draft's placement, and SGLang flags.
Without --apply the server is put back to the setting it ran before; with --out everything
(samples, events, the tuning events) is recorded into the same file format as `record`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

from tuner.commands.duration import parse_duration
from tuner.core.driver import Driver
from tuner.core import setting as vocab
from tuner.core.event_text import event_text
from tuner.core.records import Event, thaw
from tuner.core.text import terminal_safe


MAX_STEPS_BOUND = 64
"""The deepest chain `tune --max-steps` and the TUI's `--tune-max-steps` accept (one bound for both:
the search space, and the cost of every probe, grow with it)."""


def int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if any(v < 1 for v in out):
        raise argparse.ArgumentTypeError("values must be >= 1")
    return out


def _placements(text: str) -> list[str]:
    from tuner.tuning.settings import PLACEMENTS
    out = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in PLACEMENTS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"placements are {', '.join(PLACEMENTS)} (got {text!r})")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tuner.commands.attach import add_load_arguments
    from tuner.commands.keys import add_key_arguments

    parser.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:30000")
    add_key_arguments(parser)
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
    parser.add_argument("--placements", type=_placements, default=None,
                        help="draft placements to consider (default: every one the server can set live; "
                             "with --schedule: sharded)")
    parser.add_argument("--no-off", action="store_true", help="do not consider tier 0 (steps 0, draft kept warm)")
    parser.add_argument("--schedule", action="store_true",
                        help="tune per batch size: sweep the load 1, 2, 4, ... (--load 0: the server's own "
                             "traffic), fit each batch bucket and export SGLang's adaptive config")
    parser.add_argument("--max-load", type=int, default=None, metavar="N",
                        help="with --schedule: the highest load swept (default: the server's max_running_requests)")
    parser.add_argument("--adaptive-config", type=Path, default=None, metavar="FILE",
                        help="with --schedule: write SGLang's --speculative-adaptive-config JSON here")
    add_load_arguments(parser, tui=False)      # headless: no l key
    parser.set_defaults(load=4)


def _say(line: str) -> None:
    print(terminal_safe(line, keep_newlines=True), flush=True)


def say_event(e: Event) -> None:
    """A tuning event as a line of its own (tuner.core.event_text's words); its findings indented
    under the decisions. The finish is the summary that follows."""
    if not e.kind.startswith("tuning_") or e.kind == "tuning_finished":
        return
    said = event_text(e.kind, thaw(e.data))
    if said is not None:
        _say(("" if e.kind in TOP_LEVEL else "  ") + said.text)


TOP_LEVEL = frozenset({"tuning_started", "tuning_applied"})


def run(args: argparse.Namespace) -> int:
    from tuner.backends import ServerError, connect
    from tuner.commands.attach import prompts_for
    from tuner.commands.keys import ApiKeyError, api_key_of
    from tuner.core.session import Session
    from tuner.tuning.live import InlineRunner, Tuner, TunerOptions, TuningError
    from tuner.tuning.settings import tune_space
    from tuner.tuning.summary import summary

    try:
        budget = parse_duration(args.budget)
        prompts = prompts_for(args) if args.load > 0 else []
    except (OSError, ValueError) as e:
        print(f"specdecode-tune tune: {e}", file=sys.stderr)
        return 2
    if not 1 <= args.max_steps <= MAX_STEPS_BOUND:
        print(f"specdecode-tune tune: --max-steps must be between 1 and {MAX_STEPS_BOUND}", file=sys.stderr)
        return 2
    if args.schedule and args.apply:
        print("specdecode-tune tune: --schedule leaves the server as it found it; launch with the exported "
              "adaptive config instead of --apply", file=sys.stderr)
        return 2
    if not args.schedule and (args.max_load is not None or args.adaptive_config is not None):
        print("specdecode-tune tune: --max-load and --adaptive-config need --schedule", file=sys.stderr)
        return 2
    if args.max_load is not None and args.max_load < 1:
        print("specdecode-tune tune: --max-load must be at least 1", file=sys.stderr)
        return 2
    if any(k > 1 for k in args.topk) and not args.draft_tokens:
        print("specdecode-tune tune: trees (--topk > 1) need --draft-tokens", file=sys.stderr)
        return 2
    for flag, path in (("--json", args.json_out), ("--adaptive-config", args.adaptive_config)):
        if path is None:
            continue
        from tuner.recording.outputs import OutputError, check_output
        try:   # before tuning: a result that cannot be written must not cost the whole budget
            check_output(path, overwrite=True, flag="")
        except OutputError as e:
            print(f"specdecode-tune tune: {flag}: {e}", file=sys.stderr)
            return 2
    try:
        api_key = api_key_of(args)
    except ApiKeyError as e:
        print(f"specdecode-tune tune: {e}", file=sys.stderr)
        return 2
    try:
        backend = connect(args.url, api_key=api_key)
    except ServerError as e:
        print(terminal_safe(f"specdecode-tune tune: {e}"), file=sys.stderr)
        return 1
    recorder = None
    if args.out is not None:
        try:
            recorder = _open_recorder(args.out, backend)
        except Exception as e:  # noqa: BLE001 - RecordingError, OSError: one line either way
            print(f"specdecode-tune tune: cannot record to {args.out}: {e}", file=sys.stderr)
            return 2
    session = Session(backend, recorder=recorder)
    driver = Driver(session, on_event=say_event)
    session.start()
    placements = args.placements
    if args.schedule and placements is None:
        # A schedule's tiers are chain steps per batch size on one placement: the draft inside the
        # TP group, the only one SGLang has (--placements widens the table, not the export).
        from probes.names import SHARDED
        placements = [SHARDED]
    space = tune_space(lambda arg: backend.why_not(arg) is None, args.max_steps, args.topk, args.draft_tokens,
                       placements, include_off=not args.no_off,
                       steps_allowed=backend.capabilities.allowed_values(vocab.STEPS))
    try:
        if args.schedule:
            from tuner.commands.tune_schedule import run_schedule
            _say(f"tuning a schedule on {args.url} ({backend.kind})")
            rc = run_schedule(args, backend, session, driver, space, prompts, budget, _say)
            if args.out is not None and rc == 0:
                _say(f"recorded to {args.out}")
            return rc
        try:
            tuner = Tuner(session, space, TunerOptions(budget_s=budget, apply_best=args.apply),
                          runner=InlineRunner())
        except TuningError as e:
            print(f"specdecode-tune tune: {e}", file=sys.stderr)
            return 1
        if args.load > 0:
            session.start_load(prompts, args.load, args.max_new_tokens)
        _say(f"tuning {args.url} ({backend.kind}); load: "
             + (f"{args.load} requests in flight" if args.load else "the server's own traffic"))
        driver.start_tuner(tuner)
        stop = threading.Event()
        interrupted = False
        while True:
            try:
                driver.run(stop, until=lambda: not driver.tuner_running())
                break
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted = True
                _say("interrupted: putting the server back and summarising (Ctrl-C again to quit at once)")
                driver.cancel_tuner()
        if tuner.result is None:
            print(f"specdecode-tune tune: {tuner.status}", file=sys.stderr)
            return 1
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
            from tuner.recording.outputs import OutputError, write_text
            try:
                write_text(args.json_out, json.dumps(doc, indent=1) + "\n")
                _say(f"result written to {args.json_out}")
            except OutputError as e:
                print(f"specdecode-tune tune: --json: {e}", file=sys.stderr)
                return 1
        if args.out is not None:
            _say(f"recorded to {args.out}")
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        driver.close()
        session.close()


def _open_recorder(path: Path, backend):  # noqa: ANN001, ANN202
    """The core's Recorder with the standard header (same format as `record`)."""
    from tuner.recording import Recorder, header_for

    return Recorder(path, header_for(backend, command="tune"))
