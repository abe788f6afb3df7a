"""`doctor` over a fleet: every server checked at once, one verdict line (or JSON object) each.

Used by tuner.commands.doctor alone, which hands over its `diagnose` (so the checks and their words
stay doctor's). Each server runs on its own thread through the same opener as one server
(`open_session`, its reads bounded); a server that cannot be reached, or is not a server this tool
knows, is its own line. Exit status: the worst of the servers' (0 all present, 1 a required
capability missing, 2 a server unreachable). Prints only at the end, in the fleet's order.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from tuner.commands.options import OpenError, open_session
from tuner.core.text import terminal_safe
from tuner.fleet.members import Member, ask_each
from tuner.fleet.poller import member_key

JOIN_MARGIN_S = 60.0     # past --wait-s: connect and the checks' reads are each bounded


def _one(args: argparse.Namespace, m: Member, key: str | None, diagnose: Callable, required: frozenset[str],
         missing_status: str) -> dict[str, Any]:
    try:
        with open_session(args, url=m.url, key=member_key(m, key)) as opened:
            head, checks = diagnose(opened.backend, args.wait_s, args.probe)
    except OpenError as e:
        return {"name": m.name, "rc": 2, "verdict": f"unreachable: {e}", "checks": []}
    except ValueError as e:           # a member's key file
        return {"name": m.name, "rc": 2, "verdict": f"cannot ask: {e}", "checks": []}
    missing = [c for c in checks if c.status == missing_status]
    needed = [c for c in missing if c.id in required]
    if not missing:
        verdict = "ok: everything this tool uses is present"
    else:
        verdict = (f"{len(missing)} missing: " + ", ".join(c.capability for c in missing)
                   + ("" if len(needed) == len(missing) else f" ({len(needed)} required)"))
    return {"name": m.name, "rc": 1 if needed else 0, "server": head, "verdict": verdict,
            "checks": [{"capability": c.capability, "status": c.status, "found": c.found, "fix": c.fix}
                       for c in checks]}


def run_fleet(args: argparse.Namespace, members: list[Member], diagnose: Callable, capabilities: dict,
              missing_status: str) -> int:
    from tuner.commands.options import api_key

    try:
        key = api_key(args)
    except OpenError as e:
        from tuner.commands.options import fail
        return fail("doctor", e, 2)
    required = args.require or frozenset(capabilities)
    results = ask_each(members, lambda m: _one(args, m, key, diagnose, required, missing_status),
                       max(args.wait_s, 0.5) + JOIN_MARGIN_S, "doctor")
    out = [results.get(m.name, {"name": m.name, "rc": 2, "verdict": "no verdict in time", "checks": []})
           for m in members]
    if args.json:
        print(json.dumps({"servers": out, "required": sorted(required),
                          "ok": all(r["rc"] == 0 for r in out)}, indent=1))
    else:
        width = max(len(m.name) for m in members)
        mark = {0: "ok ", 1: "NO ", 2: "-- "}
        for r in out:
            line = f"{r['name']:<{width}}  {mark[r['rc']]} {r['verdict']}"
            if r.get("server"):
                line += f"  [{r['server']}]"
            print(terminal_safe(line))
    return max(r["rc"] for r in out)
