"""`specdecode-tune once URL`: watch a server (or a fleet) for a few seconds headless and print its readings.

For people (a quick look over SSH) and for tests: tok/s, acceptance with per-position p_k and a_k,
per-phase ms per iteration with their comm parts, the active setting and what can change live.
Optionally applies changes first (--set) and drives load (--load). A thin shell over the headless
driver (tuner.core.driver), which ticks the session. Several URLs, `--fleet` or `--router` watch a
fleet instead: one row per server (tuner.commands.once_fleet). Prints, never draws: no Textual.
"""

from __future__ import annotations

import argparse
import json
import threading

from tuner.commands.once_readout import format_table, readings
from tuner.commands.fleet_options import add_fleet_server_arguments, fleet_of
from tuner.commands.options import (OpenError, add_load_arguments, api_key, fail, open_session, parse_change,
                                    prompts_for)
from tuner.core.driver import Driver
from tuner.core.text import terminal_safe

TICK_S = 0.1
FIRST_READINGS_S = 0.5        # rates need two polls
SETTLE_WAIT_MAX_S = 10.0      # settling waits for decode iterations, which need traffic


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_fleet_server_arguments(p)
    p.add_argument("--seconds", type=float, default=3.0, help="how long to watch (default 3)")
    p.add_argument("--set", dest="changes", action="append", default=[], metavar="KEY=VALUE",
                   help="apply a live change first, e.g. --set speculative_num_steps=2 (repeatable)")
    add_load_arguments(p, tui=False)
    p.set_defaults(max_new_tokens=64)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    from tuner.core.ab import settle_end

    rc = 0
    try:
        changes = dict(parse_change(c) for c in args.changes)
        prompts = prompts_for(args)
        members = fleet_of(args)
        if members is not None:
            from tuner.commands.once_fleet import run_fleet
            return run_fleet(args, members, api_key(args), changes, prompts)
        with open_session(args, start=True) as opened:
            session = opened.session
            changed = False
            if changes:
                res = session.set_config(changes, by="once")
                changed = res.ok
                if not res.ok:
                    rc = fail("once", f"change refused: {res.reason}", 1)
            if args.load > 0:
                session.start_load(prompts, args.load, max_new_tokens=args.max_new_tokens)
                changed = True
            # Settle first when something changed (tuner.core.windows: the later of 2 s and 20 decode
            # iterations after it), then watch. Iterations need traffic: without any, the wait ends at
            # SETTLE_WAIT_MAX_S and the readings say what they say. Nothing changed (a refused change
            # changes nothing): only the first polls.
            changed_at = session.now()
            driver, stop = Driver(session), threading.Event()
            if changed:
                driver.run(stop, tick_s=TICK_S, duration_s=SETTLE_WAIT_MAX_S,
                           until=lambda: session.now() >= settle_end(session.store, changed_at))
            else:
                driver.run(stop, tick_s=TICK_S, duration_s=FIRST_READINGS_S)
            t0 = session.now()
            driver.run(stop, tick_s=TICK_S, duration_s=args.seconds)
            session.stop_load()
    except OpenError as e:                   # the opener's rule: 2 for the command's inputs, 1 for the server
        return fail("once", e)
    except ValueError as e:                  # PromptFileError and a bad --set: the command's inputs
        return fail("once", e, 2)
    # Read after close: a poll still in flight when the time was up (a slow server) has ended by
    # then (its deadline bounds it), and what it found belongs to this look.
    r = readings(session, t0)
    if not r["server"].get("kind") or r["connection"].startswith(("disconnected", "degraded")):
        rc = 1
    # json.dumps escapes control characters; the table is made terminal-safe line by line.
    print(json.dumps(r, indent=1, sort_keys=True) if args.json else terminal_safe(format_table(r), keep_newlines=True))
    return rc
