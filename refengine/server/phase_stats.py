"""Counters and decode-log windows computed from the engine's per-iteration phase records.

The HTTP process follows the phase stream (the same records /specdecode/phases serves) and keeps
SGLang's window statistics (accept len/rate, gen throughput every --decode-log-interval iterations)
and our lifetime counters. Pure arithmetic over record dicts: no threads, no I/O, no torch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from probes.names import DRAFT, DRAFT_EXTEND, R_DRAFT_TOKENS, R_PHASE_MS, VERIFY

# Our phase -> SGLang's forward_execution_seconds_total category (reference §7.4).
CATEGORY = {DRAFT: "eagle_draft", DRAFT_EXTEND: "eagle_draft_extend", VERIFY: "target_verify"}


@dataclass
class Window:
    """One decode-log window: what SGLang's report_decode_stats computes."""
    iterations: int = 0
    tokens: int = 0
    verifies: int = 0          # request-verify rounds (speculative iterations only)
    accepted: int = 0          # correct drafts
    proposed: int = 0          # verifies x (num_draft_tokens - 1), with each iteration's own value
    t_start: float | None = None
    t_end: float | None = None

    @property
    def accept_len(self) -> float:
        return (self.accepted + self.verifies) / self.verifies if self.verifies else 0.0

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def gen_throughput(self) -> float:
        if self.t_start is None or self.t_end is None or self.t_end <= self.t_start:
            return 0.0
        return self.tokens / (self.t_end - self.t_start)


@dataclass
class PhaseStats:
    interval: int = 40
    speculative: bool = True
    """A speculative server: a steps-0 record is SGLang's tier 0, a verify round per request with
    N = 1 (counted, as SGLang's decode log counts it: accept length 1, nothing proposed). Without
    speculation (--speculative-algorithm NONE) a record is a plain decode step."""
    decode_tokens: int = 0
    iterations: int = 0
    forward_seconds: dict[str, float] = field(default_factory=dict)
    comm_calls: dict[str, int] = field(default_factory=dict)   # rank 0's collectives per phase
    # accept_position[0] = request-verify rounds; [k] = rounds that accepted at least k drafts.
    accept_position: dict[int, int] = field(default_factory=dict)
    lifetime_verifies: int = 0
    lifetime_accept_tokens: int = 0
    last_window: Window | None = None
    adaptive_tier: tuple[int, int, int] | None = None
    """(epoch, steps, num_draft_tokens) of the latest record an adaptive schedule chose: the active
    tier, which SGLang's internal_states and spec_num_steps gauge report."""
    window: Window = field(default_factory=Window)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def feed(self, records: list[dict]) -> list[Window]:
        """Add records in sequence order; return the windows that closed (for the decode log)."""
        closed: list[Window] = []
        with self.lock:
            for r in records:
                w = self._add(r)
                if w is not None:
                    closed.append(w)
        return closed

    def _add(self, r: dict) -> Window | None:
        self.iterations += 1
        committed = int(r.get("committed", 0))
        self.decode_tokens += committed
        steps = int(r.get("steps", 0))
        if r.get("adaptive"):
            self.adaptive_tier = (int(r.get("epoch", -1)), steps, int(r.get(R_DRAFT_TOKENS, steps + 1)))
        phase_ms = r.get(R_PHASE_MS, {})
        plain = steps == 0 and not self.speculative
        for phase, ms in phase_ms.items():
            cat = "decode" if (phase == VERIFY and plain) else CATEGORY.get(phase)
            if cat is not None:
                self.forward_seconds[cat] = self.forward_seconds.get(cat, 0.0) + float(ms) / 1e3
        for phase, n in r.get("comm_calls", {}).items():
            self.comm_calls[phase] = self.comm_calls.get(phase, 0) + int(n)
        w = self.window
        t = float(r.get("t", 0.0))
        if w.t_start is None:
            w.t_start = t - float(r.get("wall_ms", 0.0)) / 1e3
        w.t_end = t
        w.iterations += 1
        w.tokens += committed
        if not plain:
            accepted = [int(a) for a in r.get("accepted", [])]
            ndt = int(r.get(R_DRAFT_TOKENS, steps + 1)) if steps > 0 else 1
            n = len(accepted)
            w.verifies += n
            w.accepted += sum(accepted)
            w.proposed += n * max(ndt - 1, 0)
            self.lifetime_verifies += n
            self.lifetime_accept_tokens += sum(accepted) + n
            self.accept_position[0] = self.accept_position.get(0, 0) + n
            for a in accepted:
                for k in range(1, a + 1):
                    self.accept_position[k] = self.accept_position.get(k, 0) + 1
        if self.interval > 0 and w.iterations >= self.interval:
            self.last_window = w
            # The next window starts where this one ended, so idle gaps count as SGLang's do.
            self.window = Window(t_start=w.t_end)
            return w
        return None

    @property
    def avg_spec_accept_length(self) -> float:
        """Lifetime mean, as SGLang's internal_states[].avg_spec_accept_length."""
        with self.lock:
            return self.lifetime_accept_tokens / self.lifetime_verifies if self.lifetime_verifies else 0.0

    def snapshot(self) -> dict:
        with self.lock:
            lw = self.last_window
            return {
                "decode_tokens": self.decode_tokens,
                "iterations": self.iterations,
                "forward_seconds": dict(self.forward_seconds),
                "comm_calls": dict(self.comm_calls),
                "accept_position": dict(self.accept_position),
                "accept_len": lw.accept_len if lw else 0.0,
                "accept_rate": lw.accept_rate if lw else 0.0,
                "gen_throughput": lw.gen_throughput if lw else 0.0,
                "avg_spec_accept_length": (self.lifetime_accept_tokens / self.lifetime_verifies
                                           if self.lifetime_verifies else 0.0),
                "adaptive_tier": self.adaptive_tier,
            }
