"""A simulated engine behind the real Session, for unit tests of the tuner's state machine.

Phase records come from known costs (tests/tuning/synth.Truth) as simulated time passes on a
ManualClock, so a test drives minutes of tuning in milliseconds and knows the true best setting.
A fake on purpose, inside unit tests of pure logic; tests/tuning/test_live_server.py runs the tuner
against the real engine server.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from probes.names import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK
from tests.tuning.synth import Truth, draw_accepted
from tuner.backends.base import Backend, Capabilities, ControlResult
from tuner.core.clock import ManualClock
from tuner.core.records import Sample
from tuner.core.session import Session
from tuner.tuning.live import InlineRunner, Tuner, TunerOptions
from tuner.tuning.settings import Setting


class SimEngine:
    def __init__(self, truth: Truth, clock: ManualClock, bs: int = 2, noise: float = 0.03,
                 seed: int = 0, penalty: Mapping[Setting, float] | None = None,
                 refuse: set[Setting] | None = None, start: Setting = Setting(3), graphs: bool = False) -> None:
        self.truth, self.clock, self.bs, self.noise = truth, clock, bs, noise
        # graphs: collectives run inside CUDA graphs, so records carry no comm_ms for them (our
        # engine on GPUs, SGLang's plugin): counted in comm_calls_in_graph, never timed.
        self.graphs = graphs
        self.rng = random.Random(seed)
        self.penalty = dict(penalty or {})
        self.refuse = set(refuse or ())
        self.setting = start
        self.epoch = 1
        self.t = clock.now()
        self.seq = 0
        self.records: list[dict] = []
        self.tokens = 0
        self.running = True

    def set_config(self, changes: Mapping[str, Any]) -> dict:
        cur = self.setting
        steps = int(changes.get("speculative_num_steps", cur.steps))
        topk = int(changes.get("speculative_eagle_topk", cur.topk if steps else 1))
        n = int(changes.get("speculative_num_draft_tokens", cur.num_draft_tokens if topk > 1 else 0))
        placement = str(changes.get("speculative_draft_placement", cur.placement))
        new = Setting(steps, topk, n if topk > 1 else 0, placement)
        if new in self.refuse:
            raise ValueError(f"refused: {new.label()}")
        self.setting = new
        self.epoch += 1
        return {"config_epoch": self.epoch, "speculative_num_steps": new.steps}

    def run_until(self, t: float) -> None:
        while self.running and self.t < t:
            s = self.setting
            terms = self.truth.terms(s)
            scale = self.penalty.get(s, 1.0)
            ph = {k: v * scale * max(0.2, 1 + self.rng.gauss(0, self.noise)) for k, v in terms.items()}
            sched = ph.pop("sched")
            accepted = [draw_accepted(self.truth, s, self.rng) for _ in range(self.bs)]
            wall = sum(ph.values()) + sched
            self.t += wall / 1000.0
            self.seq += 1
            self.tokens += sum(accepted) + self.bs
            share = self.truth.comm_share if s.placement == "sharded" else 0.02
            self.records.append({
                "seq": self.seq, "t": self.t, "epoch": self.epoch, "steps": s.steps, "topk": s.topk,
                "num_draft_tokens": s.num_draft_tokens, "placement": s.placement, "bs": self.bs,
                "committed": sum(accepted) + self.bs, "wall_ms": wall,
                "phase_ms": {**ph, "other": sched / 2},
                "comm_ms": {"draft": ph["draft"] * share, "draft_extend": ph["draft_extend"] * share,
                            "verify": ph["verify"] * 0.1},
                "comm_calls": {"draft": 4 * s.steps, "draft_extend": 4, "verify": 8},
                "accepted": accepted})
            if self.graphs:
                rec = self.records[-1]
                rec["comm_ms"] = {}
                rec["comm_calls_in_graph"] = dict(rec["comm_calls"])


class SimFeed:
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.closed = False

    def poll(self) -> list[dict]:
        out, self.engine.records = self.engine.records, []
        return out

    def close(self) -> None:
        self.closed = True


class SimBackend(Backend):
    kind = "sim"
    url = "sim://"

    def __init__(self, engine: SimEngine, placement: bool = True) -> None:
        self.engine = engine
        self._caps = Capabilities(settable=frozenset({STEPS, TOPK, DRAFT_TOKENS} | ({PLACEMENT} if placement else set())),
                                  HAS_PHASE_STREAM=True,
                                  HAS_PHASE_TIMERS=True)
        self._bus = None
        self._last_tokens = 0
        self._last_t = engine.t

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def info(self) -> dict:
        return {"tp_size": 2}

    def start(self, bus, clock) -> None:  # noqa: ANN001
        self._bus = bus

    def stop(self) -> None:
        pass

    def pump(self) -> None:
        """Called by Session.tick(): publish server/tok_per_s like the real backend's poller."""
        e = self.engine
        if self._bus is not None and e.t - self._last_t >= 0.25:
            rate = (e.tokens - self._last_tokens) / (e.t - self._last_t)
            self._bus.put(Sample(e.clock.now(), "server/tok_per_s", rate))
            self._last_tokens, self._last_t = e.tokens, e.t

    def set_config(self, changes, by="operator") -> ControlResult:  # noqa: ANN001
        try:
            active = self.engine.set_config(changes)
        except ValueError as ex:
            return ControlResult(False, dict(changes), str(ex))
        return ControlResult(True, dict(changes), "", active)


def make(truth: Truth, space, options: TunerOptions | None = None, **engine_kw: Any):
    clock = ManualClock(1000.0)
    engine = SimEngine(truth, clock, **engine_kw)
    backend = SimBackend(engine)
    session = Session(backend, clock=clock).start()
    tuner = Tuner(session, space, options or TunerOptions(budget_s=600), feed=SimFeed(engine),
                  runner=InlineRunner(), tp_size=2)
    return clock, engine, session, tuner


def drive(clock: ManualClock, engine: SimEngine, session: Session, tuner: Tuner,
          dt: float = 0.25, limit_s: float = 3600) -> float:
    """Run the tuner to the end on simulated time; returns the simulated seconds it took."""
    t0 = clock.now()
    tuner.start()
    while tuner.step():
        clock.advance(dt)
        engine.run_until(clock.now())
        session.tick()
        if clock.now() - t0 > limit_s:
            raise AssertionError(f"tuner still running after {limit_s} s: {tuner.status}")
    session.tick()
    return clock.now() - t0
