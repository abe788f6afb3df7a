"""Readings derived from raw server outputs: counter rates from /metrics, aggregates of phase records.

Both derivers are pure state machines over their inputs (a parsed MetricSet, a phase-stream page) and
the time they are told; they return records and never do I/O, so they are tested without a server.
A counter that goes down (a server restart) resets the state: no rate is invented across a restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from probes import accept_buckets as AB
from probes.names import DRAFT, DRAFT_EXTEND, R_DRAFT_TOKENS, R_PHASE_MS, VERIFY
from tuner.core import acceptance as A
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.records import NAN, Event, Sample
from tuner.backends.base import DRAFT_TOKENS, STEPS, TOPK
from tuner.backends.phase_pages import PhasePage, phase_page, record_config, restarted
from tuner.backends.promtext import MAX_ACCEPT_POSITION, MetricSet, tail_counts

# sglang:forward_execution_seconds_total categories -> our phases (sglang-0.5.23.md §7.4).
FORWARD_CATEGORIES = {"eagle_draft": DRAFT, "target_verify": VERIFY, "eagle_draft_extend": DRAFT_EXTEND,
                      "decode": "decode"}


def acceptance_samples(t: float, h: list[float], steps: int | None, num_draft_tokens: Any) -> list[Sample]:
    """spec/accept_len, accept_rate, verifies and p_k / a_k for k = 1..steps from one histogram."""
    # A server-reported step count beyond any real draft depth must not size the loop below.
    positions = steps if isinstance(steps, int) and 0 < steps <= MAX_ACCEPT_POSITION else None
    acc = A.summarize(h, num_draft_tokens, positions=positions)
    out = [Sample(t, S.SPEC_VERIFIES, float(acc.verifies)),
           Sample(t, S.SPEC_ACCEPT_LEN, acc.accept_len),
           Sample(t, S.SPEC_ACCEPT_RATE, acc.accept_rate)]
    n = positions if positions is not None else len(acc.p)
    for k in range(1, n + 1):
        out.append(Sample(t, S.accept_pos(k), acc.p[k - 1] if k <= len(acc.p) else NAN))
        out.append(Sample(t, S.accept_cond(k), acc.alpha[k - 1] if k <= len(acc.alpha) else NAN))
    return out


def bucket_samples(t: float, group: list[Mapping[str, Any]], steps: int) -> list[Sample]:
    """Per batch-size and context bucket: its request-verifies and p_1..p_steps (probes.accept_buckets).
    Only buckets the records touched get readings; with the verifies they give the counts back."""
    out = []
    for name, h in sorted(AB.histograms(group, steps).items()):
        acc = AB.position_acceptance(h, steps)
        out.append(Sample(t, S.bucket_verifies(name), float(acc.verifies)))
        out += [Sample(t, S.bucket_accept_pos(name, k), acc.p[k - 1]) for k in range(1, steps + 1)]
    return out


def _num(x: Any) -> float:
    if isinstance(x, bool):
        return float(x)
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        return NAN


def _map(x: Any) -> Mapping[str, Any]:
    """A record field that should be a mapping; anything else reads as empty (not available)."""
    return x if isinstance(x, Mapping) else {}


def _field(record: Mapping[str, Any], key: str, phase: str) -> float:
    """record[key][phase] in ms; a missing map is NaN. A phase missing from a present phase_ms
    map did not run (0); one missing from comm_ms was not measurable (collectives inside CUDA
    graphs), so NaN: "not available" is never 0."""
    if key not in record:
        return NAN
    return _num(_map(record[key]).get(phase, NAN if key == "comm_ms" else 0.0))


def _ints(x: Any) -> list[int]:
    """Accepted-draft counts of a record: ints in 0..MAX_ACCEPT_POSITION (a larger one would size the
    histogram); anything else is left out."""
    if not isinstance(x, (list, tuple)):
        return []
    return [a for a in x if isinstance(a, int) and not isinstance(a, bool) and 0 <= a <= MAX_ACCEPT_POSITION]


@dataclass
class _Counters:
    t: float
    decode_tokens: float
    accept_tail: list[float]
    phase_s: dict[str, float]
    comm_s: dict[str, float]
    iterations: float
    forward_s: dict[str, float]


class MetricsDeriver:
    """/metrics scrape -> samples. Rates are over the interval since the previous scrape.

    Args:
        acceptance: derive acceptance here (off when a phase stream gives it per iteration).
        phases: derive phase times here (off when a phase stream gives them).
    """

    def __init__(self, acceptance: bool = True, phases: bool = True) -> None:
        self.acceptance = acceptance
        self.phases = phases
        self._prev: _Counters | None = None

    def reset(self) -> None:
        self._prev = None

    def update(self, t: float, ms: MetricSet, config: Mapping[str, Any] | None = None) -> list[Sample]:
        config = config or {}
        out: list[Sample] = []
        for series, name in ((S.SERVER_RUNNING, "sglang:num_running_reqs"), (S.SERVER_QUEUED, "sglang:num_queue_reqs"),
                             (S.SERVER_GEN_THROUGHPUT, "sglang:gen_throughput"),
                             (S.SPEC_NUM_STEPS, "sglang:spec_num_steps"),
                             (S.SPEC_NUM_DRAFT_TOKENS, "sglang:spec_num_draft_tokens"),
                             (S.SPEC_TOPK, "specdecode:spec_eagle_topk")):
            if name in ms:
                out.append(Sample(t, series, ms.value(name)))
        steps = config.get(STEPS)
        if steps is None and "sglang:spec_num_steps" in ms:
            v = ms.value("sglang:spec_num_steps")
            steps = int(v) if math.isfinite(v) else None
        ndt = config.get(DRAFT_TOKENS, ms.value("sglang:spec_num_draft_tokens"))

        cur = _Counters(
            t=t,
            decode_tokens=ms.value("sglang:realtime_tokens_total", mode="decode"),
            accept_tail=tail_counts(ms, "specdecode:accept_position_total"),
            phase_s=ms.by_label("specdecode:phase_seconds_total", "phase", rank="0"),
            comm_s=ms.by_label("specdecode:phase_comm_seconds_total", "phase", rank="0"),
            iterations=ms.value("specdecode:iterations_total", rank="0"),
            forward_s=ms.by_label("sglang:forward_execution_seconds_total", "category"),
        )
        prev = self._prev
        if prev is not None and (cur.t <= prev.t or _went_down(prev, cur)):
            prev = None                      # restarted server (or a clock step): no rates this time
        self._prev = cur

        # Decode tok/s: the per-iteration counter when there is one, else SGLang's window gauge.
        if not math.isnan(cur.decode_tokens):
            if prev is not None and not math.isnan(prev.decode_tokens):
                out.append(Sample(t, S.SERVER_TOK_PER_S, (cur.decode_tokens - prev.decode_tokens) / (cur.t - prev.t)))
        elif "sglang:gen_throughput" in ms:
            out.append(Sample(t, S.SERVER_TOK_PER_S, ms.value("sglang:gen_throughput")))

        if self.acceptance:
            if cur.accept_tail:
                if prev is not None and prev.accept_tail:
                    d = A.histogram_delta(cur.accept_tail, prev.accept_tail)
                    if d is not None:
                        out += acceptance_samples(t, _tail_to_histogram(d), steps, ndt)
            else:
                if "sglang:spec_accept_length" in ms:
                    out.append(Sample(t, S.SPEC_ACCEPT_LEN, ms.value("sglang:spec_accept_length")))
                if "sglang:spec_accept_rate" in ms:
                    out.append(Sample(t, S.SPEC_ACCEPT_RATE, ms.value("sglang:spec_accept_rate")))

        if self.phases and prev is not None:
            out += self._phase_samples(t, prev, cur)
        return out

    def _phase_samples(self, t: float, prev: _Counters, cur: _Counters) -> list[Sample]:
        out: list[Sample] = []
        d_iter = cur.iterations - prev.iterations
        if cur.phase_s and math.isfinite(d_iter):
            # Plugin counters: seconds per phase ÷ iterations = ms per iteration.
            for phase in S.PHASES:
                ms_ = NAN
                if d_iter > 0 and phase in cur.phase_s:
                    ms_ = (cur.phase_s[phase] - prev.phase_s.get(phase, 0.0)) * 1e3 / d_iter
                out.append(Sample(t, S.phase_ms(phase), ms_))
                if cur.comm_s:
                    cms = NAN
                    if d_iter > 0 and phase in cur.comm_s:
                        cms = (cur.comm_s[phase] - prev.comm_s.get(phase, 0.0)) * 1e3 / d_iter
                    out.append(Sample(t, S.phase_comm_ms(phase), cms))
        elif cur.forward_s:
            # SGLang's device timer has busy seconds but no iteration count: report shares of wall time.
            dt = cur.t - prev.t
            for cat, phase in FORWARD_CATEGORIES.items():
                if cat in cur.forward_s:
                    busy = cur.forward_s[cat] - prev.forward_s.get(cat, 0.0)
                    out.append(Sample(t, S.phase_share_pct(phase), 100.0 * busy / dt))
        return out


def _tail_to_histogram(tail: list[float]) -> list[float]:
    """specdecode:accept_position_total{k} counts rounds that accepted >= k drafts (k = 0: all
    rounds); the histogram of "exactly j" is the difference of neighbours."""
    return [tail[j] - (tail[j + 1] if j + 1 < len(tail) else 0.0) for j in range(len(tail))]


def _went_down(a: _Counters, b: _Counters) -> bool:
    def down(x: float, y: float) -> bool:
        return math.isfinite(x) and math.isfinite(y) and y < x
    if down(a.decode_tokens, b.decode_tokens) or down(a.iterations, b.iterations):
        return True
    if a.accept_tail and b.accept_tail and A.histogram_delta(b.accept_tail, a.accept_tail) is None:
        return True
    for da, db in ((a.phase_s, b.phase_s), (a.comm_s, b.comm_s), (a.forward_s, b.forward_s)):
        if any(down(da[k], db[k]) for k in da.keys() & db.keys()):
            return True
    return False


def config_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs a phase record ran with, under their server-arg names (the knob table's keys)."""
    return record_config(record)


@dataclass
class PhaseStreamReader:
    """Pages of GET /specdecode/phases -> per-poll aggregate samples and config-change events.

    Records carry the server's clock; each is placed on the session clock relative to the newest
    record of the page (received `now`), so a skew between the hosts' clocks does not matter.
    """

    cursor: int | None = None
    epoch: Any = None
    config: dict[str, Any] | None = None
    iterations: int = 0
    _last_server_t: float = NAN
    _last_now: float = NAN
    extra: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.cursor = None
        self._last_server_t = NAN

    def update(self, now: float, page: PhasePage | Mapping[str, Any], history: bool = False
               ) -> tuple[list[Sample], list[Event]]:
        """Digest one page (tuner.backends.phase_pages). Raises ValueError (one line) when the page is
        not a phase page.

        history=True: the page is from before we attached (catching up): only adopt its cursor and
        configuration.
        """
        checked = page if isinstance(page, PhasePage) else phase_page(page)
        records, nxt = checked.records, checked.next
        samples: list[Sample] = []
        events: list[Event] = []
        if restarted(self.cursor, checked):
            self.reset()                     # the server restarted: its sequence began again
        first_page = self.cursor is None or history
        self.cursor = nxt
        if first_page:
            # History from before we attached says nothing about now; keep only its configuration.
            if records:
                self._adopt(records[-1])
                self._last_server_t = _num(records[-1].get("t"))
            self._last_now = now
            return samples, events
        if checked.dropped > 0:
            events.append(Event(now, EventKind.PHASE_GAP, {"dropped": checked.dropped}))
        dt = now - self._last_now if math.isfinite(self._last_now) else NAN
        self._last_now = now
        if not records:
            if math.isfinite(dt) and dt > 0:
                samples.append(Sample(now, S.SERVER_ITER_PER_S, 0.0))
            return samples, events
        newest = _num(records[-1].get("t"))

        def at(r: Mapping[str, Any]) -> float:
            rt = _num(r.get("t"))
            return now - (newest - rt) if math.isfinite(rt) and math.isfinite(newest) else now

        for group in _runs(records):
            head, tail = group[0], group[-1]
            if self.epoch is not None and head.get("epoch") != self.epoch:
                old = self.config
                self._adopt(head)
                events.append(Event(at(head), EventKind.CONFIG_CHANGED,
                                    {"old": old, "new": self.config, "epoch": head.get("epoch"),
                                     "source": "phase_stream"}))
            else:
                self._adopt(head)            # first page, or an adaptive tier switch: no event
            self.iterations += len(group)
            samples += self._aggregate(at(tail), group)
        # Iterations per second over the server's own time between pages.
        span = newest - self._last_server_t if math.isfinite(self._last_server_t) else NAN
        if math.isfinite(span) and span > 0:
            samples.append(Sample(now, S.SERVER_ITER_PER_S, len(records) / span))
        self._last_server_t = newest
        return samples, events

    def _adopt(self, record: Mapping[str, Any]) -> None:
        self.epoch = record.get("epoch")
        self.config = record_config(record)
        self.extra = {"simulated": record.get("simulated"), "emulated_comm": record.get("emulated_comm")}

    def _aggregate(self, t: float, group: list[Mapping[str, Any]]) -> list[Sample]:
        out = [Sample(t, S.SERVER_ITERATIONS, float(self.iterations))]

        def mean(values: Iterable[float]) -> float:
            vals = [v for v in values if math.isfinite(v)]
            return sum(vals) / len(vals) if vals else NAN

        for phase in S.PHASES:
            out.append(Sample(t, S.phase_ms(phase), mean(_field(r, R_PHASE_MS, phase) for r in group)))
            # SGLang's plugin cannot see collectives inside CUDA graphs and leaves comm_ms out:
            # that is "not available", never 0.
            out.append(Sample(t, S.phase_comm_ms(phase), mean(_field(r, "comm_ms", phase) for r in group)))
        walls = [_num(r.get("wall_ms")) for r in group]
        out.append(Sample(t, S.PHASE_WALL_MS, mean(walls)))
        idle = [max(0.0, w - sum(_num(v) for v in _map(r.get(R_PHASE_MS)).values()))
                for w, r in zip(walls, group)]
        out.append(Sample(t, S.PHASE_IDLE_MS, mean(idle)))
        out.append(Sample(t, S.SERVER_BATCH, mean(_num(r.get("bs")) for r in group)))
        cfg = record_config(group[0])
        for series, key in ((S.SPEC_NUM_STEPS, STEPS), (S.SPEC_TOPK, TOPK), (S.SPEC_NUM_DRAFT_TOKENS, DRAFT_TOKENS)):
            out.append(Sample(t, series, _num(cfg.get(key))))
        steps = cfg.get(STEPS)
        if isinstance(steps, int) and steps > 0:
            accepted = [a for r in group for a in _ints(r.get("accepted"))]
            out += acceptance_samples(t, [float(x) for x in A.histogram(accepted)], steps, cfg.get(DRAFT_TOKENS))
            if steps <= MAX_ACCEPT_POSITION:
                out += bucket_samples(t, group, steps)
        return out


def _runs(records: list[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Consecutive records of one epoch and one configuration. An adaptive controller switches
    tiers inside an epoch; each record says what it ran, and a run's aggregates (acceptance by
    position above all) must not mix depths."""
    def key(r: Mapping[str, Any]) -> tuple:
        return r.get("epoch"), r.get("steps"), r.get("topk"), r.get(R_DRAFT_TOKENS)

    runs: list[list[Mapping[str, Any]]] = []
    for r in records:
        if runs and key(runs[-1][-1]) == key(r):
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs
