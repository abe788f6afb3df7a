"""`once` over a fleet: watch every server at once for a few seconds, one row per server.

Used by tuner.commands.once alone. Each server has its own thread and session
(tuner.fleet.poller), so a server that hangs or dies shows as degraded or gone in its own row and
never holds the others. `--set` goes to every server first, each outcome one line (applied, refused
with the reason, or needs a relaunch). With `--prometheus`, DCGM's GPU readings, the phase split and
Prometheus-only states fill the rows; a server without a draft-collective share gets its last trace
capture's, with its age. Prints the table (tuner.fleet.rows) or one JSON object.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from tuner.core.text import terminal_safe
from tuner.fleet.change import apply_to_fleet
from tuner.fleet.members import Member
from tuner.fleet.poller import FleetPoller
from tuner.fleet.rows import aggregate, format_table

CONNECT_WAIT_S = 12.0       # at most this long for every server to answer once (each read is bounded)


def run_fleet(args: argparse.Namespace, members: list[Member], key: str | None, changes: dict[str, Any],
              prompts: list[dict]) -> int:
    stop = threading.Event()
    outcomes: dict[str, Any] = {}
    with FleetPoller(members, key=key) as poller:
        end = time.monotonic() + CONNECT_WAIT_S
        while time.monotonic() < end and not poller.first_tries_done():
            stop.wait(0.1)
        if changes:
            outcomes = apply_to_fleet(poller.sessions(), changes, by="once")
        if args.load > 0:
            for s in poller.sessions().values():
                s.start_load(prompts, args.load, max_new_tokens=args.max_new_tokens)
        stop.wait(max(args.seconds, 0.5))
        for s in poller.sessions().values():
            s.stop_load()
        rows = poller.rows()
    rows = _through_prometheus(args, rows, members)
    rows = _from_traces(rows, members)
    agg = aggregate(rows)
    if args.json:
        print(json.dumps({"servers": [r.to_json() for r in rows], "aggregate": agg,
                          "changes": {n: o.to_json() for n, o in outcomes.items()}}, indent=1, sort_keys=True))
    else:
        lines = [format_table(rows, agg)]
        lines += [f"change    {n}: {o.text}" for n, o in outcomes.items()]
        print(terminal_safe("\n".join(lines), keep_newlines=True))
    ok = all(r.state == "connected" for r in rows) and all(o.status == "applied" for o in outcomes.values())
    return 0 if ok else 1


def _through_prometheus(args: argparse.Namespace, rows: list, members: list[Member]) -> list:
    """With --prometheus: DCGM's GPU readings, the phase split where a server gave none, and the
    state of a server only Prometheus reaches (tuner.fleet.prom_overlay); its notes on stderr."""
    url = getattr(args, "prometheus", None)
    if url is None:
        return rows
    import sys

    from tuner.fleet.prom_overlay import PrometheusOverlay
    from tuner.fleet.prometheus import PrometheusClient

    with PrometheusClient(url) as client:
        overlay = PrometheusOverlay(client)
        overlay.refresh()
    for note in list(getattr(args, "fleet_notes", [])) + overlay.notes():
        print(terminal_safe(f"specdecode-tune once: {note}"), file=sys.stderr)
    return overlay.fill(rows, members)


def _from_traces(rows: list, members: list[Member]) -> list:
    """The draft's collective share from the last trace capture, with its age, where neither the
    server nor Prometheus gave one (SGLang: tuner.fleet.trace_overlay)."""
    from tuner.fleet.trace_overlay import TraceShareOverlay

    overlay = TraceShareOverlay(members)
    overlay.refresh()
    return overlay.fill(rows, members)
