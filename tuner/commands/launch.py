"""`specdecode-tune launch [OPTIONS] -- python -m sglang.launch_server ARGS…`: own the server.

Starts the SGLang server as a child (argv list, own session, log file), waits until it is ready,
then opens the TUI on it (or, with --no-tui, keeps it serving). Settings SGLang cannot change
live are applied by a relaunch with rewritten arguments: `--try KEY=VALUE,...` does that from the
command line, one relaunch per --try; in the TUI a knob key the server cannot follow live offers
the relaunch (tuner.backends.sglang.managed), and the server's log feeds SGLang's decode and
adaptive-tier lines into the session. Every command tried is printed at the end, exactly, so any
setting can be reproduced by hand. Nothing is left running when it returns.

--pin-steps 1,2,3,4,5 makes the launch adaptive with a config in which SGLang's own policy never
moves, so the specdecode plugin can pin any of those steps live (no relaunch for steps).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from tuner.commands.keys import add_key_arguments
from tuner.commands.options import (TUI_GPUS_EVERY_S, OpenError, add_load_arguments, api_key, fail, open_session,
                                    parse_change, prompts_for)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", type=Path, default=None,
                        help="server log file (default: server.log in a new temporary directory)")
    parser.add_argument("--ready-timeout", type=float, default=1800.0, metavar="S",
                        help="seconds to wait for the server to answer /health and /model_info")
    add_key_arguments(parser)
    parser.add_argument("--pin-steps", default=None, metavar="S1,S2,…",
                        help="launch adaptive with these step tiers captured, for live pinning by the plugin")
    parser.add_argument("--try", dest="tries", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="after the server is ready, relaunch with these settings (repeatable)")
    parser.add_argument("--hold", type=float, default=0.0, metavar="S",
                        help="seconds to keep each setting serving before the next --try")
    parser.add_argument("--yes", action="store_true", help="relaunch without asking")
    parser.add_argument("--no-tui", action="store_true",
                        help="do not open the TUI; with --try, exit after the last setting")
    parser.add_argument("--server-kind", choices=("auto", "sglang", "refengine"), default="auto",
                        help="how the TUI treats the server (default: detected); `sglang` on `specdecode-tune "
                             "serve` rehearses SGLang: only its live controls, the rest by relaunch")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="record the TUI's session (readings, events, relaunches) into FILE")
    add_load_arguments(parser)
    # dest is not "command": the CLI's subparser already stores the subcommand's name there.
    parser.add_argument("server_command", metavar="COMMAND", nargs=argparse.REMAINDER,
                        help="the server command after `--`, e.g. python -m sglang.launch_server ARGS…")


def parse_try(text: str) -> dict[str, object]:
    """`speculative_num_steps=5,speculative_eagle_topk=1` → {key: int | float | str}."""
    out = dict(parse_change(part, "--try") for part in filter(None, (p.strip() for p in text.split(","))))
    if not out:
        raise ValueError("--try needs at least one KEY=VALUE")
    return out


def _ask(question: str) -> bool:
    if not sys.stdin.isatty():
        print(f"{question}\n(not a terminal: pass --yes to relaunch without asking)", file=sys.stderr)
        return False
    return input(f"{question}\n[y/N] ").strip().lower() in ("y", "yes")


def _event_printer(kind: str, data: dict) -> None:
    # Before and after the TUI (and with --no-tui) events are one line each on stderr; while the
    # TUI runs they go to its session (tuner.backends.sglang.managed.ManagedRelaunch).
    print(f"specdecode-tune launch: event {kind} {json.dumps(data, sort_keys=True)}", file=sys.stderr)


def run(args: argparse.Namespace, run_app: Callable[[Any], None] | None = None) -> int:
    """The command. `run_app(app)` runs the TUI (default: `app.run()`, on this terminal)."""
    from tuner.backends.sglang.args import ArgsError, Launch, check_command, with_pinning
    from tuner.backends.sglang.launch import LaunchError, ManagedServer

    cmd = list(args.server_command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        check_command(cmd)
        tries = [parse_try(t) for t in args.tries]
        args.api_key = api_key(args)
        if args.load < 0:
            raise ValueError("--load must be 0 or more")
        if args.record is not None and args.no_tui:
            raise ValueError("--record records the TUI's session: drop --no-tui, or run "
                             "`specdecode-tune record URL` beside it")
        args.prompt_list = prompts_for(args)
    except (ArgsError, ValueError, OSError, OpenError) as e:
        return fail("launch", e, 2)
    log_path = args.log or Path(tempfile.mkdtemp(prefix="specdecode-launch-")) / "server.log"
    launch = Launch(tuple(cmd))
    if args.pin_steps:
        try:
            steps = [int(s) for s in args.pin_steps.split(",") if s.strip()]
            cfg_path = log_path.parent / "adaptive-pinning.json"
            launch, cfg = with_pinning(launch, steps, cfg_path)
        except (ArgsError, ValueError) as e:
            return fail("launch", f"--pin-steps: {e}", 2)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(json.dumps(cfg) + "\n")

    def progress(text: str) -> None:
        print(f"specdecode-tune launch: {text}", file=sys.stderr, flush=True)

    server = ManagedServer(launch, log_path, ready_timeout_s=args.ready_timeout, api_key=args.api_key,
                           on_event=_event_printer, on_progress=progress,
                           confirm=(lambda q: True) if args.yes else _ask)
    # SIGTERM ends us like Ctrl-C does, so the finally below always stops the server.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    progress(f"server log: {log_path}")
    rc = 0
    try:
        server.start()
        for changes in tries:
            _hold(server, args.hold)
            if not server.relaunch(changes):
                progress(f"relaunch with {changes} declined")
        if args.no_tui:
            if tries:
                _hold(server, args.hold)
            else:
                progress(f"serving at {server.url}; Ctrl-C stops it")
                while server.alive():
                    time.sleep(0.5)
                if server.proc is not None and server.proc.returncode not in (0, None):
                    progress(f"the server exited with status {server.proc.returncode}\n{server.log_tail()}")
                    rc = 1
        else:
            rc = _attach(server, args, run_app or (lambda app: app.run()))
    except (ArgsError, LaunchError) as e:
        progress(str(e))
        rc = 1
    except KeyboardInterrupt:
        rc = 130
    finally:
        server.shutdown()          # a relaunch still running on the TUI's worker starts nothing after
        signal.signal(signal.SIGTERM, previous)
        print(server.report(), file=sys.stderr)
    return rc


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _hold(server, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and server.alive():
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def _attach(server, args: argparse.Namespace, run_app: Callable[[Any], None]) -> int:
    """The TUI over the managed server: knob keys it cannot follow live offer a relaunch, the
    server's log feeds the session, and `--record` records it all."""
    from tuner.app import make_app
    from tuner.backends.sglang.managed import LogFeed, ManagedRelaunch

    kind = None if args.server_kind == "auto" else args.server_kind
    events, progress = server.on_event, server.on_progress
    try:
        with open_session(args, server.url, key=args.api_key, kind=kind, record=args.record,
                          header={"command": "launch", "launch_command": server.launch.display()},
                          gpus_every_s=TUI_GPUS_EVERY_S) as opened:
            session = opened.session
            # While the TUI owns the terminal nothing prints: relaunch events go to the session (its
            # log and the recording), progress to the TUI's bar.
            relauncher = ManagedRelaunch(server, session.put, session.now)
            feed = LogFeed(server.log_path, session.put, session.now).start()
            try:
                run_app(make_app(session, load=args.load, prompts=args.prompt_list, max_new_tokens=args.max_new_tokens,
                                 gpu_labels=opened.gpu_labels, relauncher=relauncher))
            finally:
                feed.stop()
    except OpenError as e:
        return fail("launch", e)
    finally:
        server.on_event, server.on_progress = events, progress
    if args.record is not None:
        print(f"specdecode-tune launch: recorded to {args.record}", file=sys.stderr)
    return 0
