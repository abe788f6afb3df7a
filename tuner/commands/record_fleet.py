"""`record --out FILE` over a fleet: every server's session into one recording, a server column in
every table (schema 2).

Used by tuner.commands.record alone. Each server has its own thread and session (tuner.fleet.poller),
each session writes through its own sink of the one Recorder (tuner.recording.recorder.ServerSink),
so a server that hangs or dies holds only its own thread while the others go on being recorded. The
header lists the members (schema.FLEET_KEY) and keeps each one's own header (schema.SERVER_KEY + name)
from its first connect. Stops on SIGINT/SIGTERM, at --duration, or at the first write failure. Must
not import textual; prints progress on stderr only.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from tuner.commands.options import OpenError
from tuner.commands.record_terminal import Stopper, file_size, hms, mb
from tuner.core.redact import redact_url
from tuner.fleet.members import Member
from tuner.fleet.poller import CONNECT_TIMEOUT_S, FleetPoller, member_key
from tuner.fleet.rows import aggregate, format_table

CONNECT_WAIT_S = 12.0     # at most this long for every server's first answer before the load starts


def run_fleet_record(args: argparse.Namespace, members: list[Member], key: str | None, header: dict[str, Any],
                     prompts: list[dict], store_factory: Any) -> int:
    """Record the fleet into args.out; 0 when the file was written, 1 when writing failed."""
    from tuner.recording import Recorder, header_for
    from tuner.recording.schema import FLEET_KEY, SERVER_KEY

    if args.capture_trace_every or args.set_at:
        raise OpenError("--capture-trace-every and --set-at record one server: name one URL", 2)
    for note in getattr(args, "fleet_notes", []):
        _say(note)
    fleet = [{"name": m.name, "url": redact_url(m.url)} for m in members]
    try:
        recorder = Recorder(args.out, {**header, FLEET_KEY: fleet}, overwrite=args.overwrite)
    except Exception as e:  # noqa: BLE001 - RecordingError, OSError: one line either way
        raise OpenError(f"cannot record to {args.out}: {e}", 2) from None

    def opener(member: Member) -> Any:
        from tuner.backends import connect
        from tuner.core.session import Session

        backend = connect(member.url, api_key=member_key(member, key), timeout=CONNECT_TIMEOUT_S)
        recorder.set_header(SERVER_KEY + member.name, header_for(backend, name=member.name))
        return Session(backend, recorder=recorder.for_server(member.name), store=store_factory())

    t0 = time.monotonic()
    stop = threading.Event()
    try:
        with Stopper(stop), FleetPoller(members, opener=opener) as poller:
            end = time.monotonic() + CONNECT_WAIT_S
            while time.monotonic() < end and not poller.first_tries_done() and not stop.is_set():
                stop.wait(0.1)
            loaded: set[str] = set()

            def load_the_connected(late: bool) -> None:
                # A member that answers only later (down at the start, slow to connect, a router's
                # worker that registered since) gets the same load from then on.
                for name, s in poller.sessions().items():
                    if args.load > 0 and name not in loaded:
                        loaded.add(name)
                        s.start_load(prompts, args.load, max_new_tokens=args.max_new_tokens)
                        if late:
                            _say(f"{name} answered: its load of {args.load} starts now")
            load_the_connected(late=False)
            _say(f"recording {len(members)} servers into {args.out}; "
                 + (f"for {hms(args.duration)}" if args.duration else "Ctrl-C or SIGTERM stops"))
            deadline = None if args.duration is None else t0 + args.duration
            while not stop.is_set() and recorder.error is None:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                load_the_connected(late=True)
                stop.wait(0.1)
            for s in poller.sessions().values():
                s.stop_load()
            rows = poller.rows()
    finally:
        recorder.close()
    if recorder.error:
        _say(recorder.error)
        return 1
    _say(format_table(rows, aggregate(rows)).replace("\n", "\n  "))
    _say(f"wrote {args.out} ({recorder.written} records from {len(members)} servers, {mb(file_size(args.out))}, "
         f"{time.monotonic() - t0:.0f} s); see it with `specdecode-tune replay {args.out}` or "
         f"`specdecode-tune report {args.out} --out report.html`")
    return 0


def _say(msg: str) -> None:
    from tuner.core.text import terminal_safe
    print(f"specdecode-tune record: {terminal_safe(msg, keep_newlines=True)}", file=sys.stderr)
