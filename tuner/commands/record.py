"""`specdecode-tune record URL --out FILE`: the headless session in a plain loop, into one recording.

For shared boxes reached over SSH: no terminal has to stay open (run it under nohup/tmux/systemd),
and Textual is never imported. A thin shell over the headless driver (tuner.core.driver), which
ticks the session (handing every record to the core's Recorder) and runs the trace captures on a
timer and the scripted setting changes; this prints progress and the events an operator away from
the screen must know on stderr, in tuner.core.event_text's words. It stops cleanly on SIGINT/SIGTERM
or at --duration; after a SIGKILL the file still opens (the Recorder commits about every second). A server that goes away is the backend's business: it
emits `disconnected`/`connected` events (the marked gap) and the recording goes on.

Must not import textual or reach into the store for anything but the progress line.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from tuner.commands.duration import parse_duration
from tuner.commands.keys import argv_for_record
from tuner.commands.options import (OpenError, add_load_arguments, add_server_arguments, api_key, fail, open_session,
                                    parse_change, prompts_for)
from tuner.core.driver import Driver, ScheduledChange
from tuner.core.event_text import event_text
from tuner.core.events import EventKind as K
from tuner.core.records import Event
from tuner.core.setting import pairs as setting_pairs
from tuner.core.redact import redact_url
from tuner.core.text import terminal_safe

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
    add_server_arguments(p)
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


# -- progress -----------------------------------------------------------------------------------------

class Progress:
    """One line on stderr: rewritten in place on a terminal, printed every `every_s` otherwise."""

    def __init__(self, stream: TextIO, every_s: float = 10.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.every_s = 0.5 if self.tty else every_s
        self._monotonic = monotonic
        self._last = -math.inf
        self._shown = False

    def update(self, line: str, force: bool = False) -> None:
        now = self._monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        line = terminal_safe(line)          # server strings (setting values, errors) are data
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self._shown = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, line: str) -> None:
        """A message of its own line (an event worth a line: a capture, a disconnect)."""
        if self.tty and self._shown:
            self.stream.write("\r\x1b[2K")
            self._shown = False
        self.stream.write(terminal_safe(line) + "\n")
        self.stream.flush()
        self._last = -math.inf if self.tty else self._last

    def end(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False


def _hms(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _size(path: Path) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.path.getsize(str(path) + suffix)
        except OSError:
            pass
    return total


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


# -- what the operator reads ------------------------------------------------------------------------------

SAID = frozenset({K.DISCONNECTED, K.DEGRADED, K.CONFIG_CHANGED, K.CONFIG_REFUSED, K.TRACE_CAPTURED, K.NOTE})


def worth_a_line(e: Event) -> bool:
    """The events `record` says on a line of their own: the server going and coming back, a slow
    server, the setting moving or refused, captures and notes (a failed capture or change)."""
    if e.kind == K.CONNECTED:      # the first connection is the "recording ..." line already
        return e.data.get("was") == "degraded" or float(e.data.get("after_s") or 0) > 0
    return e.kind in SAID


def say_event(progress: Progress) -> Callable[[Event], None]:
    def say(e: Event) -> None:
        said = event_text(e.kind, e.data) if worth_a_line(e) else None
        if said is not None:
            progress.say(said.text)
    return say


def status_line(driver: Driver, path: Path, duration_s: float | None) -> str:
    from tuner.core import series as S

    session = driver.session
    st = session.store
    dur = f" / {_hms(duration_s)}" if duration_s else ""
    tok = st.value(S.LOAD_TOK_PER_S) if st.latest(S.LOAD_TOK_PER_S) else st.value(S.SERVER_TOK_PER_S)
    acc = st.value(S.SPEC_ACCEPT_LEN)
    written = getattr(session.recorder, "written", driver.moved)
    conn = session.connection().text()
    parts = [f"recording {_hms(driver.elapsed())}{dur}", f"{written} records", _mb(_size(path)),
             "tok/s " + ("n/a" if math.isnan(tok) else f"{tok:.1f}"),
             "accept " + ("n/a" if math.isnan(acc) else f"{acc:.2f}"),
             _setting(session.active_config()), f"traces {driver.captures}", conn]
    return " · ".join(p for p in parts if p)


def _setting(active: Any) -> str:
    return setting_pairs(active)


# -- the command ------------------------------------------------------------------------------------

def _command_line(argv: list[str], key: str | None = None) -> str:
    """The command line as stored in the recording: the key never, however it was spelled."""
    return "specdecode-tune " + " ".join(shlex.quote(a) for a in argv_for_record(argv, key))


class _Stopper:
    """SIGINT/SIGTERM set an Event (the loop ends at its next tick); the old handlers come back after."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_Stopper":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt   # a second Ctrl-C: the operator means it
        self.stop.set()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


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
        record_opts = {"duration_s": args.duration, "load": args.load, "max_new_tokens": args.max_new_tokens,
                       "capture_trace_every_s": args.capture_trace_every, "capture_steps": args.capture_steps,
                       "set_at": [{"at_s": c.at_s, "key": c.key, "value": c.value} for c in args.set_at]}
        header = {"command": _command_line(sys.argv[1:], key), "record": record_opts}
        with open_session(args, key=key, check=lambda b: _can_capture(args, b), record=args.out, header=header,
                          overwrite=args.overwrite, store=record_store(), start=True,
                          gpus_every_s=1.0 / args.nvml_hz if args.nvml_hz > 0 else None) as opened:
            driver = _record(args, opened, prompts)
    except OpenError as e:
        return fail("record", e)
    if opened.recorder.error:
        return fail("record", opened.recorder.error)
    print(f"specdecode-tune record: wrote {args.out} ({opened.recorder.written} records, {driver.captures} trace "
          f"captures, {_mb(_size(args.out))}, {time.monotonic() - t0:.0f} s); see it with `specdecode-tune replay "
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
        with _Stopper(stop):
            if args.load > 0:
                session.start_load(prompts, args.load, max_new_tokens=args.max_new_tokens)
            progress.say(f"recording {redact_url(args.url)} ({opened.backend.kind}) into {args.out}; "
                         + (f"for {_hms(args.duration)}" if args.duration else "Ctrl-C or SIGTERM stops"))
            # The first write failure (disk full, file removed) ends the recording at once: a long
            # one must not run on for hours with nothing written.
            driver.run(stop, tick_s=TICK_S, duration_s=args.duration, until=lambda: recorder.error is not None,
                       on_tick=lambda: progress.update(status_line(driver, args.out, args.duration)))
    finally:
        progress.end()
    return driver
