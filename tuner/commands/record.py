"""`specdecode-tune record URL --out FILE`: the headless session in a plain loop, into one recording.
Several URLs, `--fleet`, `--router` or `--prometheus` record a fleet into one file instead
(tuner.commands.record_fleet).

For shared boxes reached over SSH: no terminal has to stay open (run it under nohup/tmux/systemd),
and Textual is never imported. A thin shell over the headless driver (tuner.core.driver), which
ticks the session (handing every record to the core's Recorder) and runs the trace captures on a
timer and the scripted setting changes; this prints progress and the events an operator away from
the screen must know on stderr (tuner.commands.record_terminal). It stops cleanly on SIGINT/SIGTERM
or at --duration; after a SIGKILL the file still opens (the Recorder commits about every second). A
server that goes away is the backend's business: it emits `disconnected`/`connected` events (the
marked gap) and the recording goes on.

Must not import textual.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tuner.commands.duration import parse_duration
from tuner.commands.fleet_options import add_fleet_server_arguments, fleet_of
from tuner.commands.keys import command_line
from tuner.commands.options import (OpenError, add_load_arguments, api_key, fail, open_session, parse_change,
                                    prompts_for)
from tuner.commands.record_terminal import (Progress, Stopper, _setting, file_size, hms, mb,  # noqa: F401
                                           say_event, status_line)
from tuner.core.driver import Driver, ScheduledChange
from tuner.core.redact import redact_url

TICK_S = 0.1
# The recording is the file; the store only feeds the progress line and event messages. Small rings
# keep an hours-long recording's memory flat (the TUI's default keeps hours of every series).
STORE_READINGS = 4 * 600          # ten minutes of a 4 Hz series per series
STORE_TRACES = 1                  # GPU traces can be hundreds of MB each; the file has them all


def record_store():
    """The bounded store the headless recorder uses."""
    from tuner.core.store import Store
    return Store(capacity=STORE_READINGS, trace_capacity=STORE_TRACES)


def parse_set_at(text: str) -> ScheduledChange:
    when, sep, change = str(text).partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set-at wants WHEN:KEY=VALUE, got {text!r}")
    try:
        key, value = parse_change(change, "--set-at")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return ScheduledChange(0.0 if when.strip() in ("0", "") else parse_duration(when), key, value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_fleet_server_arguments(p)
    p.add_argument("--out", "-o", type=Path, required=True, metavar="FILE", help="the recording to write (SQLite)")
    p.add_argument("--duration", type=parse_duration, default=None, metavar="D",
                   help="stop after D (90, 5m, 2h; default: until Ctrl-C or SIGTERM)")
    add_load_arguments(p, tui=False)
    p.add_argument("--capture-trace-every", type=parse_duration, default=None, metavar="D",
                   help="capture a profiler trace on every rank every D (analysed and stored in the file)")
    p.add_argument("--capture-steps", type=int, default=5, metavar="N", help="decode steps per trace (default 5)")
    p.add_argument("--set-at", type=parse_set_at, action="append", default=[], metavar="WHEN:KEY=VALUE",
                   help="change a setting WHEN after the start, e.g. 20s:speculative_num_steps=4 (repeatable)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace FILE if it is an existing recording or an empty file (nothing else)")
    p.add_argument("--nvml-hz", type=float, default=10.0, metavar="HZ",
                   help="NVML readings per second per GPU (default 10; 0 = none; they are most of a long "
                        "recording's size)")
    p.add_argument("--progress-every", type=parse_duration, default=10.0, metavar="D",
                   help="progress line interval when stderr is not a terminal (default 10s)")


def run(args: argparse.Namespace) -> int:
    from tuner.recording.outputs import OutputError, check_output
    from tuner.recording.recorder import not_replaceable_recording

    if args.load < 0:
        return fail("record", "--load must be 0 or more", 2)
    if args.capture_steps < 1:
        return fail("record", "--capture-steps must be 1 or more", 2)
    if not (args.nvml_hz == 0 or 0.1 <= args.nvml_hz <= 100):
        return fail("record", "--nvml-hz must be 0 (no NVML) or between 0.1 and 100", 2)
    try:   # before connecting: a refused --out costs the operator nothing
        check_output(args.out, overwrite=args.overwrite, may_replace=not_replaceable_recording)
        prompts = prompts_for(args)
    except OutputError as e:
        return fail("record", e, 2)
    except (OSError, ValueError) as e:
        return fail("record", f"prompts: {e}", 2)
    t0 = time.monotonic()
    try:
        key = api_key(args)
        record_opts = {"duration_s": args.duration, "load": args.load, "rate": args.rate,
                       "max_new_tokens": args.max_new_tokens,
                       "capture_trace_every_s": args.capture_trace_every, "capture_steps": args.capture_steps,
                       "set_at": [{"at_s": c.at_s, "key": c.key, "value": c.value} for c in args.set_at]}
        header = {"command": command_line(sys.argv[1:], key), "record": record_opts}
        members = fleet_of(args)
        if members is not None:
            from tuner.commands.record_fleet import run_fleet_record
            return run_fleet_record(args, members, key, header, prompts, record_store)
        with open_session(args, key=key, check=lambda b: _can_capture(args, b), record=args.out, header=header,
                          overwrite=args.overwrite, store=record_store(), start=True,
                          gpus_every_s=1.0 / args.nvml_hz if args.nvml_hz > 0 else None) as opened:
            driver = _record(args, opened, prompts)
    except OpenError as e:
        return fail("record", e)
    if opened.recorder.error:
        return fail("record", opened.recorder.error)
    print(f"specdecode-tune record: wrote {args.out} ({opened.recorder.written} records, {driver.captures} trace "
          f"captures, {mb(file_size(args.out))}, {time.monotonic() - t0:.0f} s); see it with `specdecode-tune replay "
          f"{args.out}` or `specdecode-tune report {args.out} --out report.html`", file=sys.stderr)
    return 0


def _can_capture(args: argparse.Namespace, backend: Any) -> None:
    if args.capture_trace_every and not backend.capabilities.CAN_CAPTURE_TRACE:
        raise OpenError(f"{redact_url(args.url)} cannot capture profiler traces (drop --capture-trace-every)", 2)


def _record(args: argparse.Namespace, opened: Any, prompts: list[dict]) -> Driver:
    """Record until --duration, a signal or the first write failure; the driver, for its counts."""
    from tuner.tuning.controller_watch import ControllerWatch

    session, recorder = opened.session, opened.recorder
    progress = Progress(sys.stderr, every_s=args.progress_every)
    driver = Driver(session, schedule=args.set_at, capture_every_s=args.capture_trace_every,
                    capture_steps=args.capture_steps, on_event=say_event(progress),
                    watch=ControllerWatch(session))
    stop = threading.Event()
    try:
        with Stopper(stop):
            if args.load > 0:
                session.start_load(prompts, args.load, max_new_tokens=args.max_new_tokens)
            progress.say(f"recording {redact_url(args.url)} ({opened.backend.kind}) into {args.out}; "
                         + (f"for {hms(args.duration)}" if args.duration else "Ctrl-C or SIGTERM stops"))
            # The first write failure (disk full, file removed) ends the recording at once: a long
            # one must not run on for hours with nothing written.
            driver.run(stop, tick_s=TICK_S, duration_s=args.duration, until=lambda: recorder.error is not None,
                       on_tick=lambda: progress.update(status_line(driver, args.out, args.duration)))
    finally:
        progress.end()
    return driver
