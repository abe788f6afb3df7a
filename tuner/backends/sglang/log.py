"""SGLang 0.5.23's decode log line, parsed into samples (reference §8).

SGLang's stats rank prints, every --decode-log-interval decode iterations:

    [2026-01-01 12:00:00 TP0] Decode batch, #running-req: 1, #token: 1234, token usage: 0.01,
    accept len: 2.95, accept rate: 0.49, cuda graph: True, gen throughput (token/s): 94.12,
    #queue-req: 0

The prefix carries " DP{d}", " PP{p}", " ATTN_CP{c}", " MOE_DP{m}", " TP{t}", " EP{e}" (each only
when that size is above 1), and ".mmm" milliseconds with SGLANG_LOG_MS=1. The middle holds
"key: value" parts whose set varies (hybrid pools, DSPARK, PD-decode, MFU and occupancy
suffixes), so the message is split into parts rather than matched whole; unknown parts are kept.

Adaptive mode (`--speculative-adaptive`) logs its tier moves on TP rank 0, two lines:

    [..] Adaptive spec params updated: steps 3 -> 4 (ema_accept_len=3.61)
    [..] Switch adaptive runtime state: steps 3 -> 4, draft_tokens 4 -> 5

the first when the policy of the current batch's batch-size slot moves
(sglang/srt/speculative/adaptive_spec_params.py:263-272, `_apply_target_steps`), the second when the
worker swaps to another captured tier, for a policy move or because the batch routed to another
slot (sglang/srt/speculative/eagle_worker_v2.py:1861-1872, `apply_runtime_state`). Both go through
`log_info_on_rank0` (sglang/srt/utils/common.py:3982-3990), which may append
" (rank-check failed: …)". `parse_tier_line` reads them; neither names the slot, see
tuner.tuning.adaptive_tiers for that.

`parse_line` / `parse_lines` / `parse_tier_line` are pure; `LogTail` follows a growing file by byte
offset. Lines that are not decode lines are skipped; a decode line that does not parse is reported,
never guessed. Must not import torch or textual.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from tuner.core import series as S
from tuner.core.records import Sample

_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(?P<ms>\d{3}))?"
    r"(?P<prefix>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] (?P<msg>.*)$")
_PREFIX_PART = re.compile(r" (DP|PP|ATTN_CP|MOE_DP|TP|EP)(\d+)")
_HEAD = re.compile(r"^Decode batch(?: \[(?P<iter>\d+)\])?$")
_GRAPH = re.compile(r"^(cuda|cpu|npu|musa) graph$")
_RANK_CHECK = r"(?: \(rank-check failed: .*\))?$"
_POLICY = re.compile(r"^Adaptive spec params updated: steps (?P<old>\d+) -> (?P<new>\d+) "
                     r"\(ema_accept_len=(?P<ema>[-+0-9.eE]+|nan|inf|-inf)\)" + _RANK_CHECK)
_SWITCH = re.compile(r"^Switch adaptive runtime state: steps (?P<old>\d+) -> (?P<new>\d+), "
                     r"draft_tokens (?P<old_n>\d+) -> (?P<new_n>\d+)" + _RANK_CHECK)

SERIES_TOKEN_USAGE = "server/token_usage"

# part key -> DecodeLine attribute, for the parts every SGLang decode line may carry
_KEYS = {
    "#running-req": "running_reqs", "#token": "tokens", "token usage": "token_usage",
    "accept len": "accept_len", "accept rate": "accept_rate",
    "gen throughput (token/s)": "gen_throughput", "#queue-req": "queue_reqs",
}


class LogLineError(ValueError):
    """A line that says it is a decode line but does not read as one."""


@dataclass(frozen=True)
class DecodeLine:
    t: float                       # epoch seconds (the log's local time, read with `utc_offset`)
    ranks: dict[str, int]          # {"TP": 0, "DP": 1, ...}: only the parts the prefix had
    running_reqs: int
    queue_reqs: int
    gen_throughput: float
    tokens: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None      # None: speculation off
    accept_rate: float | None = None
    graph: bool | None = None
    iteration: int | None = None         # with SGLANG_LOG_FORWARD_ITERS
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def dp(self) -> int:
        return self.ranks.get("DP", 0)


@dataclass(frozen=True)
class TierLine:
    """One adaptive tier move from the log: the policy's ("policy": a slot's EMA moved its steps)
    or the worker's ("switch": it now runs another captured tier)."""
    t: float
    ranks: dict[str, int]
    kind: str                             # "policy" | "switch"
    old_steps: int
    new_steps: int
    ema_accept_len: float | None = None   # policy lines: the slot's EMA of correct drafts per request
    old_draft_tokens: int | None = None   # switch lines
    new_draft_tokens: int | None = None

    @property
    def dp(self) -> int:
        return self.ranks.get("DP", 0)


def _number(key: str, raw: str, line: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise LogLineError(f"decode log: {key!r} is not a number in: {line[:200]}") from None


def parse_line(line: str, *, utc_offset_s: float | None = None) -> DecodeLine | None:
    """The decode line's readings, None for any other line; LogLineError for a broken one.

    `utc_offset_s`: the server's UTC offset (seconds east); None reads the time as this host's
    local time, which is what SGLang wrote when both run on one machine.
    """
    m = _LINE.match(line.rstrip("\r\n"))
    if m is None or not m.group("msg").startswith("Decode batch"):
        return None
    parts = m.group("msg").split(", ")
    head = _HEAD.match(parts[0])
    if head is None:
        raise LogLineError(f"decode log: unexpected head {parts[0]!r}")
    values: dict[str, float] = {}
    extra: dict[str, str] = {}
    graph = None
    for part in parts[1:]:
        key, sep, raw = part.partition(": ")
        if not sep:
            extra[part] = ""
            continue
        if key in _KEYS:
            values[_KEYS[key]] = _number(key, raw, line)
        elif _GRAPH.match(key):
            graph = raw == "True"
        else:
            extra[key] = raw
    for need in ("running_reqs", "gen_throughput", "queue_reqs"):
        if need not in values:
            raise LogLineError(f"decode log: no {need} in: {line[:200]}")
    t = _time(m, utc_offset_s)
    ranks = {k: int(v) for k, v in _PREFIX_PART.findall(m.group("prefix"))}
    return DecodeLine(
        t=t, ranks=ranks, running_reqs=int(values["running_reqs"]),
        queue_reqs=int(values["queue_reqs"]), gen_throughput=values["gen_throughput"],
        tokens=int(values["tokens"]) if "tokens" in values else None,
        token_usage=values.get("token_usage"), accept_len=values.get("accept_len"),
        accept_rate=values.get("accept_rate"), graph=graph,
        iteration=int(head.group("iter")) if head.group("iter") else None, extra=extra)


def _time(m: re.Match, utc_offset_s: float | None) -> float:
    st = time.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S")
    t = time.mktime(st) if utc_offset_s is None else _utc_epoch(st) - utc_offset_s
    return t + int(m.group("ms")) / 1000.0 if m.group("ms") else t


def parse_tier_line(line: str, *, utc_offset_s: float | None = None) -> TierLine | None:
    """An adaptive tier move (policy or switch line), None for any other line."""
    m = _LINE.match(line.rstrip("\r\n"))
    if m is None:
        return None
    msg = m.group("msg")
    ranks = {k: int(v) for k, v in _PREFIX_PART.findall(m.group("prefix"))}
    if (p := _POLICY.match(msg)) is not None:
        return TierLine(_time(m, utc_offset_s), ranks, "policy", int(p.group("old")), int(p.group("new")),
                        ema_accept_len=float(p.group("ema")))
    if (w := _SWITCH.match(msg)) is not None:
        return TierLine(_time(m, utc_offset_s), ranks, "switch", int(w.group("old")), int(w.group("new")),
                        old_draft_tokens=int(w.group("old_n")), new_draft_tokens=int(w.group("new_n")))
    return None


def _utc_epoch(st: time.struct_time) -> float:
    import calendar

    return float(calendar.timegm(st))


def parse_lines(lines: Iterable[str], *, utc_offset_s: float | None = None,
                errors: list[str] | None = None) -> list[DecodeLine]:
    """Every decode line; broken ones go to `errors` (if given) as one-line messages."""
    out = []
    for line in lines:
        try:
            d = parse_line(line, utc_offset_s=utc_offset_s)
        except LogLineError as e:
            if errors is not None:
                errors.append(str(e))
            continue
        if d is not None:
            out.append(d)
    return out


def to_samples(lines: Iterable[DecodeLine], *, dp: int = 0) -> list[Sample]:
    """Samples of one DP rank's lines (each DP's stats rank logs its own window)."""
    out: list[Sample] = []
    for d in lines:
        if d.dp != dp:
            continue
        out += [Sample(d.t, S.SERVER_GEN_THROUGHPUT, d.gen_throughput),
                Sample(d.t, S.SERVER_RUNNING, float(d.running_reqs)),
                Sample(d.t, S.SERVER_QUEUED, float(d.queue_reqs))]
        if d.token_usage is not None:
            out.append(Sample(d.t, SERIES_TOKEN_USAGE, d.token_usage))
        if d.accept_len is not None:
            out.append(Sample(d.t, S.SPEC_ACCEPT_LEN, d.accept_len))
            out.append(Sample(d.t, S.SPEC_ACCEPT_RATE,
                              d.accept_rate if d.accept_rate is not None else math.nan))
    return out


def read_log(path: str | Path, **kw) -> list[DecodeLine]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_lines(f, **kw)


class LogTail:
    """Follows a log file SGLang is writing: each `poll()` parses the lines completed since the
    last one. A file that shrank (rotated or truncated) is read again from its start."""

    def __init__(self, path: str | Path, *, from_end: bool = False,
                 utc_offset_s: float | None = None) -> None:
        self.path = Path(path)
        self.utc_offset_s = utc_offset_s
        self.offset = self.path.stat().st_size if from_end and self.path.exists() else 0
        self._rest = b""
        self.errors: list[str] = []

    def poll(self) -> list[DecodeLine]:
        """The decode lines completed since the last call."""
        return parse_lines(self.read_lines(), utc_offset_s=self.utc_offset_s, errors=self.errors)

    def poll_all(self) -> tuple[list[DecodeLine], list[TierLine]]:
        """The decode lines and the adaptive tier moves completed since the last call."""
        lines = self.read_lines()
        tiers = [x for x in (parse_tier_line(ln, utc_offset_s=self.utc_offset_s) for ln in lines) if x]
        return parse_lines(lines, utc_offset_s=self.utc_offset_s, errors=self.errors), tiers

    def read_lines(self) -> list[str]:
        """The lines completed since the last call (a partial last line waits for its newline)."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:
            self.offset, self._rest = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        data = self._rest + data
        complete, newline, self._rest = data.rpartition(b"\n")
        if not newline:
            self._rest = data
            return []
        return complete.decode("utf-8", errors="replace").split("\n")


def log_samples(decodes: Iterable[DecodeLine], tiers: Iterable[TierLine] = (), *, dp: int = 0) -> list[Sample]:
    """Managed mode's samples from the log, under `log/` names (tuner.core.series) so they never mix
    with the same readings from /metrics: decode tok/s, accept length, running requests per decode
    line, and the steps of the tier the worker runs after each switch line."""
    out: list[Sample] = []
    for d in decodes:
        if d.dp != dp:
            continue
        out += [Sample(d.t, S.LOG_GEN_THROUGHPUT, d.gen_throughput),
                Sample(d.t, S.LOG_RUNNING, float(d.running_reqs))]
        if d.accept_len is not None:
            out.append(Sample(d.t, S.LOG_ACCEPT_LEN, d.accept_len))
    out += [Sample(x.t, S.LOG_TIER_STEPS, float(x.new_steps)) for x in tiers
            if x.kind == "switch" and x.dp == dp]
    return out
