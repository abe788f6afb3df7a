"""Synthetic phase-stream records from known costs and acceptance, for the cost model's unit tests.

A fake on purpose: these tests check that the fit recovers what generated the data. The live
tuner's tests use the real engine server instead.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tuner.tuning.settings import Setting


@dataclass
class Truth:
    draft0: float = 0.5          # ms, fixed part of the draft phase
    step: float = 1.2            # ms per chain draft step
    branch: float = 0.3          # ms per extra branch per step
    extend0: float = 0.8
    extend_n: float = 0.1
    verify0: float = 4.0
    verify_n: float = 0.4
    sample0: float = 0.2
    sample_n: float = 0.02
    sched: float = 0.6
    prefill: float = 0.0         # ms per iteration: prefilling the admitted requests (the load's cost)
    comm_share: float = 0.5      # of the draft and draft_extend phases, sharded placement
    p: tuple[float, ...] = (0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.07)
    tree_gain: float = 1.15      # τ of a tree relative to the chain of the same depth
    off_verify: float = 3.6

    def terms(self, s: Setting) -> dict[str, float]:
        # No prefill key unless there is prefill: the seeded streams of the other tests stay as
        # they were (every term draws its noise), and such records read like an older server's.
        pre = {"prefill": self.prefill} if self.prefill else {}
        if s.steps == 0:
            return {"draft": 0.0, "draft_extend": 0.0, "verify": self.off_verify,
                    "verify_sample": self.sample0, **pre, "sched": self.sched}
        n = s.num_draft_tokens
        draft = self.draft0 + self.step * (s.steps - 1) + self.branch * (s.steps - 1) * (s.topk - 1)
        extend = self.extend0 + self.extend_n * n
        if s.placement != "sharded":
            draft *= 1 - self.comm_share
            extend *= 1 - self.comm_share
        return {"draft": draft, "draft_extend": extend, "verify": self.verify0 + self.verify_n * n,
                "verify_sample": self.sample0 + self.sample_n * n, **pre, "sched": self.sched}

    def tau(self, s: Setting) -> float:
        if s.steps == 0:
            return 1.0
        t = 1.0 + sum(self.p[: s.steps])
        if s.topk > 1:
            t = min(t * self.tree_gain, 1 + min(s.steps, s.num_draft_tokens - 1))
        return t

    def tok_s(self, s: Setting, bs: int) -> float:
        return 1000.0 * bs * self.tau(s) / sum(self.terms(s).values())


def draw_accepted(truth: Truth, s: Setting, rng: random.Random) -> int:
    if s.steps == 0:
        return 0
    if s.topk > 1:
        # Trees: a distribution with the right mean (the tests only use the mean).
        mean = truth.tau(s) - 1
        lo = int(mean)
        return min(lo + (1 if rng.random() < mean - lo else 0), s.steps)
    u = rng.random()
    j = 0
    while j < s.steps and u < truth.p[j]:
        j += 1
    return j


@dataclass
class Stream:
    truth: Truth
    seed: int = 0
    noise: float = 0.03                 # relative gaussian noise on every phase
    t: float = 1000.0
    seq: int = 0
    epoch: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def records(self, s: Setting, n: int, bs: int = 1, new_epoch: bool = True) -> list[dict]:
        if new_epoch:
            self.epoch += 1
        out = []
        terms = self.truth.terms(s)
        for _ in range(n):
            ph = {k: max(v * (1 + self.rng.gauss(0, self.noise)), 0.0) for k, v in terms.items()}
            sched = ph.pop("sched")
            share = self.truth.comm_share if s.placement == "sharded" else 0.02
            comm = {"draft": ph["draft"] * share, "draft_extend": ph["draft_extend"] * share,
                    "verify": ph["verify"] * 0.2, "verify_sample": 0.0, "other": 0.0}
            accepted = [draw_accepted(self.truth, s, self.rng) for _ in range(bs)]
            wall = sum(ph.values()) + sched
            ph["other"] = sched * 0.5
            self.seq += 1
            self.t += wall / 1000.0
            out.append({"seq": self.seq, "t": self.t, "epoch": self.epoch, "steps": s.steps,
                        "topk": s.topk, "num_draft_tokens": s.num_draft_tokens,
                        "placement": s.placement, "bs": bs,
                        "committed": sum(accepted) + bs, "wall_ms": wall,
                        "phase_ms": ph, "comm_ms": comm,
                        "comm_calls": {"draft": 4 * max(s.steps - 1, 0) + 1, "verify": 17,
                                       "verify_sample": 1, "draft_extend": 4, "other": 0},
                        "accepted": accepted, "simulated": False, "emulated_comm": False})
        return out
