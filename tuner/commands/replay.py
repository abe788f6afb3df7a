"""`specdecode-tune replay FILE`: the same TUI over a recording, read-only, on the recording's clock.

Keys: space pauses, `.` steps one second, ←/→ seek 10 s, `<`/`>` halve or double the speed.
A fleet recording opens the fleet screen (one replaying session per member, tuner.fleet.poller);
enter opens one member's replay in the usual view.
A file that is not a readable recording is one line on stderr; what is readable is still shown.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tuner.commands.options import fail, run_fleet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE", help="a recording made by `specdecode-tune record`")
    parser.add_argument("--speed", type=float, default=1.0, help="playback speed (default 1)")
    parser.add_argument("--start", type=float, default=0.0, metavar="S",
                        help="start S seconds into the recording")
    parser.add_argument("--paused", action="store_true", help="open paused")


def open_replay(path: Path, start: float = 0.0, speed: float = 1.0, paused: bool = False):
    """A started session over the recording, positioned `start` seconds in (shared with the tests)."""
    from tuner.core.session import Session
    from tuner.recording import ReplayBackend

    backend = ReplayBackend(path, speed=speed, paused=paused)
    session = Session(backend)
    session.start()
    if start:
        session.seek(backend.start_t + start)
    return session


def open_fleet_replay(path: Path, speed: float = 1.0, paused: bool = False):
    """A fleet recording's members as a FleetPoller (not started) whose sessions replay each member's
    part of the file; None for a one-server recording (shared with the tests)."""
    from tuner.core.session import Session
    from tuner.fleet.members import Member
    from tuner.fleet.poller import FleetPoller
    from tuner.recording import ReplayBackend, open_recording
    from tuner.recording.reader import fleet_members

    with open_recording(path) as reader:
        members = [Member(m["name"], str(m.get("url") or ""), source="recording") for m in fleet_members(reader.header)]
    if not members:
        return None
    return FleetPoller(members, opener=lambda m: Session(ReplayBackend(path, speed=speed, paused=paused,
                                                                      server=m.name)))


def _replay_fleet(poller) -> int:
    """The fleet screen over the recording; enter opens that member's replay in the usual view."""
    from tuner.app import make_app

    return run_fleet(poller, lambda session: make_app(session).run())


def run(args: argparse.Namespace) -> int:
    from tuner.recording import RecordingError

    # `not x > 0` also refuses NaN, which passes every comparison-based `<= 0` check.
    if not (math.isfinite(args.speed) and args.speed > 0):
        return fail("replay", "--speed must be a number above 0", 2)
    if not (math.isfinite(args.start) and args.start >= 0):
        return fail("replay", "--start must be a number of seconds, 0 or more", 2)
    if not args.file.exists():
        return fail("replay", f"{args.file}: no such file", 1)
    try:
        fleet = open_fleet_replay(args.file, args.speed, args.paused)
        if fleet is not None:
            if args.start:
                return fail("replay", f"{args.file} records a fleet: --start seeks one server (open it with enter, "
                            "then seek)", 2)
            return _replay_fleet(fleet)
        session = open_replay(args.file, args.start, args.speed, args.paused)
    except RecordingError as e:
        return fail("replay", e, 1)
    from tuner.app import make_app

    if session.backend.problem:
        print(f"specdecode-tune replay: {args.file}: {session.backend.problem} (showing what is readable)",
              file=sys.stderr)
    try:
        make_app(session).run()
    finally:
        session.close()
    return 0
