"""Durations on the command line (`--duration 1h30m`, `--budget 5m`, `--set-at 20s:...`): one grammar.

A number of seconds (`90`, `1.5`), or one or more number+unit parts (`250ms`, `90s`, `5m`, `5min`,
`2h`, `1d`, `1h30m`, `1.5h`); spaces and case are ignored. A bad one is a one-line DurationError,
which is both a ValueError (for callers that check values) and an argparse.ArgumentTypeError (so
argparse prints its message as it is). Must not do anything but parse.
"""

from __future__ import annotations

import argparse
import math
import re

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|min|s|m|h|d)?")


class DurationError(argparse.ArgumentTypeError, ValueError):
    """Not a duration (one line, for people)."""


def parse_duration(text: str) -> float:
    """Seconds from `90`, `90s`, `5m`, `2h`, `1h30m`, `1.5h`, `250ms`; DurationError (one line) otherwise."""
    s = str(text).strip().lower().replace(" ", "")
    pos, total, parts = 0, 0.0, 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None or m.end() == pos:
            raise DurationError(f"not a duration: {text!r} (use e.g. 90, 5m, 2h, 1h30m)")
        if m.group(2) is None and m.end() != len(s):
            raise DurationError(f"not a duration: {text!r} (a unit is needed between parts)")
        total += float(m.group(1)) * UNITS[m.group(2) or "s"]
        pos, parts = m.end(), parts + 1
    if parts == 0 or not math.isfinite(total) or total <= 0:
        raise DurationError(f"not a duration: {text!r} (use e.g. 90, 5m, 2h; more than 0)")
    return total
