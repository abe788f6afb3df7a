"""Live tuning: probe a few settings on the running server, fit the cost model, apply the predicted
best, verify it with an interleaved A/B against the previous best, refine, stop within noise.

`Tuner` is a step-wise state machine driven by the session clock: `step(now)` never blocks and
never sleeps, so the TUI's tune screen calls it from a timer and tests call it with a ManualClock.
Blocking work runs elsewhere: control requests through a `runner` (a worker thread by default,
inline for headless loops and tests), phase records through a `PhaseFeed` (the tuner's own cursor on
/specdecode/phases). Every decision becomes an Event on the session's bus (kinds `tuning_*`), so
the store, recordings and the report see the tuning. The tuner never touches widgets or the store
(it reads the store's tok/s windows for the A/B, which the session fills).

Stages: probe (the starting setting, then what tuner.tuning.probing says could change the answer)
→ propose → verify (A/B) → complete the table (probes held back so the first proposal came sooner)
→ propose … → finish (leave the best applied, or restore the starting setting).
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Mapping, Sequence

from probes.names import DRAFT_TOKENS, PLACEMENT, REPLICATED, SHARDED, STEPS, TOPK
from tuner.core.setting import extra_knobs
from tuner.core import timeline
from tuner.core import windows as core_windows
from tuner.core.events import EventKind, TuningKind
from tuner.core.records import Event
from probes.adaptive_policy import acceptance_only_pick
from tuner.tuning.cost_model import CostModel, Prediction, best, fit_cost_model, recommend
from tuner.tuning.export import (adaptive_config, adaptive_flags, placement_note, sglang_flags)
from tuner.tuning.observations import Iteration, parse_record, summarise
from tuner.tuning.phase_feed import PhaseFeed
from tuner.tuning.probing import next_probes
from tuner.tuning.settings import Setting
from tuner.tuning.slo import LATENCY, Objective, itl_values, predicted_itl, windowed_itl


class TuningError(Exception):
    """The tuner cannot run against this server (one line, for people)."""


class State(StrEnum):
    """The tuner's lifecycle (strings, so views and `tune --json` read them as words)."""

    IDLE = "idle"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Stage(StrEnum):
    """Where a running tuner is (the module docstring's stages); the value is what the tune screen says."""

    WAITING = "waiting for the first decode iteration"
    PROBING = "probing"
    COMPLETING = "completing"      # the probes held back so the first proposal came sooner
    PROPOSING = "proposing"
    VERIFYING = "verifying"
    FINISHING = "finishing"        # putting the best (or the starting) setting back
    DONE = "done"
    FAILED = "failed"


class Purpose(StrEnum):
    """Why a job measures (or only applies) a setting; recorded in `tuning_probe` events."""

    PROBE = "probe"
    CANDIDATE = "candidate"
    INCUMBENT = "incumbent"
    APPLY = "apply"


@dataclass(frozen=True)
class TunerOptions:
    budget_s: float = 300.0
    settle_s: float = core_windows.SETTLE_S                 # "What better means": drop the later of
    settle_iters: int = core_windows.SETTLE_ITERATIONS      # 2 s and 20 iterations after a change
    probe_s: float = 1.0             # measured seconds per probe, after settling: phase means and
                                     # acceptance need iterations, not 1-s tok/s windows (the A/B's)
    probe_min_iters: int = 10        # a floor for fast iterations only: on a slow link (100-300 ms
                                     # iterations) this, not probe_s, sets a probe's length, and 30
                                     # made a probe cost more than a grid point's 3 s (acceptance pools
                                     # every probe and the A/B's iterations anyway)
    ab_segment_s: float = 3.0        # measured seconds per A/B segment (3 one-second windows)
    ab_pairs: int = 2                # candidate/incumbent segment pairs per verification ...
    ab_max_pairs: int = 4            # ... extended one pair at a time while the interval spans 1
    noise_floor: float = 0.02        # predicted gains below this are within noise
    measured_margin: float = 0.10    # a probe's tok/s this far above the incumbent's is a lead the
                                     # model's prediction must not overrule: it is A/B'd next (one
                                     # probe is ~1 s of server time, so smaller leads are its noise)
    max_rounds: int = 3              # verifications at most
    apply_best: bool = True          # leave the best applied (else restore the starting setting)
    stall_s: float = 20.0            # no iteration of a setting for this long: say so
    objective: Objective = Objective()   # what proposals and verdicts judge (tuner.tuning.slo)


class InlineRunner:
    """Runs a control request at once on the caller's thread (headless loops, tests)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except Exception as e:  # noqa: BLE001 - handed to the tuner through the future
            fut.set_exception(e)
        return fut

    def shutdown(self) -> None:
        pass


class ThreadRunner:
    """Runs control requests on one worker thread (the TUI: never block its event loop)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-control")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Job:
    """One measurement (or a bare apply when measure_s == 0) of one setting."""

    setting: Setting
    purpose: Purpose
    measure_s: float
    min_iters: int
    future: Future | None = None
    applied: bool = False
    epoch: int | None = None
    t_apply: float = math.nan        # session time the change was confirmed
    first_t: float = math.nan        # server time of its first iteration
    seen: int = 0
    settled_at: float = math.nan     # session time settling ended
    end_at: float = math.nan
    iters: list[Iteration] = field(default_factory=list)


@dataclass(frozen=True)
class ABOutcome:
    setting: Setting
    incumbent: Setting
    verdict: str                     # better | worse | same
    ratio: float
    lo: float
    hi: float
    predicted_ratio: float
    n_candidate: int
    n_incumbent: int
    series: str

    def to_json(self) -> dict:
        return {"setting": self.setting.to_json(), "incumbent": self.incumbent.to_json(),
                "verdict": self.verdict, "ratio": self.ratio, "lo": self.lo, "hi": self.hi,
                "predicted_ratio": self.predicted_ratio, "windows": [self.n_candidate, self.n_incumbent],
                "series": self.series}


@dataclass(frozen=True)
class TuningResult:
    initial: Setting
    best: Setting
    applied: Setting                 # what the server runs after tuning
    bs: int
    stop_reason: str
    elapsed_s: float
    probes: int
    verifications: tuple[ABOutcome, ...]
    predictions: tuple[Prediction, ...]
    model: CostModel | None
    acceptance_only: Setting | None
    measured_tok_s: Mapping[Setting, float]
    # What the cost model says about the result (recommendations, SGLang flags, the acceptance-only
    # prediction, the placement what-if): derive_advice(), computed once when the tuner finishes.
    advice: Mapping[str, Any] = field(default_factory=dict)
    # Settings measured faster than the pick beyond the probes' noise and never judged by an A/B:
    # said beside the result, never silently dropped (probe tok/s, ratio to the pick's).
    unverified_leads: tuple[tuple[Setting, float], ...] = ()
    # Under an objective other than plain throughput: what it was, each measured setting's latency
    # figures and whether it met the SLO, and the nearest setting when none did (Tuner._objective_report).
    objective: Mapping[str, Any] | None = None

    def to_json(self) -> dict:
        ao = self.acceptance_only
        extra = {"objective": dict(self.objective)} if self.objective is not None else {}
        return {**extra,
            "initial": self.initial.to_json(), "best": self.best.to_json(),
            "applied": self.applied.to_json(), "bs": self.bs, "stop_reason": self.stop_reason,
            "elapsed_s": round(self.elapsed_s, 3), "probes": self.probes,
            "measured_tok_s": [{**s.to_json(), "tok_s": v} for s, v in self.measured_tok_s.items()],
            "verifications": [v.to_json() for v in self.verifications],
            "predictions": [p.to_json() for p in self.predictions],
            "recommendations": self.advice.get("recommendations", {}), "sglang": self.advice.get("sglang", {}),
            "acceptance_only": None if ao is None else {
                **ao.to_json(), "predicted_tok_s": self.advice.get("acceptance_only_tok_s"),
                "measured_tok_s": self.measured_tok_s.get(ao)},
            "what_if": self.advice.get("what_if"),
            "model": self.model.to_json() if self.model is not None else None,
            "unverified_leads": [{**s.to_json(), "ratio": r} for s, r in self.unverified_leads],
        }


def derive_advice(best_s: Setting, predictions: Sequence[Prediction], model: CostModel | None,
                  acceptance_only: Setting | None, bs: int) -> dict[str, Any]:
    """TuningResult.advice: per-batch recommendations, the SGLang flags (SGLang runs the draft
    inside the TP group only, so they come from the best sharded setting), the acceptance-only
    setting's predicted tok/s and the best setting's placement what-if."""
    recs: dict[str, Any] = {}
    sglang_best = best_s
    flags: dict[str, Any] = {"note": placement_note(best_s)}
    if model is not None:
        space = [p.setting for p in predictions]
        recs = {str(b): p.to_json() for b, p in recommend(model, space).items()}
        if best_s.placement != SHARDED:
            top = best(p for p in predictions if p.setting.placement == SHARDED)
            sglang_best = top.setting if top is not None else Setting(0)
        chains = {b: p.setting for b, p in recommend(
            model, [s for s in space if s.topk == 1 and s.placement == SHARDED]).items()}
        if chains:
            flags["adaptive_config"] = adaptive_config(chains)
            flags["adaptive_flags"] = adaptive_flags(chains, "tuned-adaptive.json")
    flags["best"] = sglang_best.to_json()
    flags["setting"] = sglang_flags(sglang_best)
    ao_pred = model.predict(acceptance_only, bs) if model is not None and acceptance_only is not None else None
    what_if = None
    if model is not None and best_s.steps > 0:
        w = model.what_if(best_s, bs, REPLICATED)
        what_if = w.to_json() if w else None
    return {"recommendations": recs, "sglang": flags,
            "acceptance_only_tok_s": ao_pred.tok_s if ao_pred else None, "what_if": what_if}


def active_epoch(active: Any) -> int | None:
    """The config epoch in a control reply's read-back (`config_epoch` as /server_info names it)."""
    if not isinstance(active, Mapping):
        return None
    for key in ("config_epoch", "epoch"):
        v = active.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def probe_plan(space: Sequence[Setting], initial: Setting) -> list[Setting]:
    """The probes known before any measurement: the starting setting, then (unless the what-if moves
    the lead to another placement) the starting placement's deepest chain, or its shallowest when
    it starts at the deepest, and one mid tree per topk. `probing.next_probes` decides the rest
    from the fit (see tuner.tuning.probing)."""
    placement = initial.placement if initial.steps > 0 else SHARDED
    chains = sorted({s.steps for s in space if s.topk == 1 and s.steps > 0 and s.placement == placement})
    plan = [initial]
    if chains:
        st = chains[-1] if chains[-1] != initial.steps or initial.topk != 1 else chains[0]
        plan.append(Setting(st, placement=placement))
    for k in sorted({s.topk for s in space if s.topk > 1}):
        trees = sorted((s for s in space if s.topk == k and s.placement == placement),
                       key=lambda s: (s.steps, s.num_draft_tokens))
        if trees:
            plan.append(trees[len(trees) // 2])
    return [s for s in dict.fromkeys(plan) if s == initial or s in space]


class Tuner:
    """See the module docstring. Public surface for views:

    state (`State`), stage (`Stage`), status (one line), progress() in [0, 1],
    model, predictions (newest table at the main batch size), measured (Setting -> tok/s),
    verifications, result (after done), apply(setting) (operator's choice from the table),
    cancel().
    """

    def __init__(self, session: Any, space: Sequence[Setting], options: TunerOptions | None = None,
                 feed: PhaseFeed | None = None, runner: Any = None, tp_size: int | None = None) -> None:
        self.session = session
        self.opts = options or TunerOptions()
        backend = getattr(session, "backend", None)
        caps = getattr(backend, "capabilities", None)
        if caps is not None:
            if not caps.can_set(STEPS):
                raise TuningError(caps.why_not(STEPS) or "this server cannot change steps live")
            if feed is None and not caps.HAS_PHASE_STREAM:
                raise TuningError("this server has no per-iteration phase stream (/specdecode/phases); "
                                  "the tuner needs it to measure phase costs")
        self._caps = caps
        space = [s for s in space if self._settable(s)]
        if not space:
            raise TuningError("no setting in the search space can be applied live on this server")
        self.space = sorted(set(space))
        if feed is None:
            from tuner.tuning.phase_feed import HttpPhaseFeed
            feed = HttpPhaseFeed(backend.url, getattr(backend, "api_key", None))
        self.feed = feed
        self.runner = runner or ThreadRunner()
        if tp_size is None:
            for info in (getattr(backend, "info", None),
                         session.server_info() if hasattr(session, "server_info") else None):
                tp = info.get("tp_size") if isinstance(info, Mapping) else None
                if isinstance(tp, int):
                    tp_size = tp
                    break
        self.tp_size = tp_size
        self.state = State.IDLE
        self.stage = Stage.WAITING
        self.status = "not started"
        self.model: CostModel | None = None
        self.predictions: list[Prediction] = []
        self.measured: dict[Setting, float] = {}    # Σ committed / Σ wall of every measurement
        self._sums: dict[Setting, tuple[int, float]] = {}
        self.verifications: list[ABOutcome] = []
        self.result: TuningResult | None = None
        self.bad_records = 0
        self._iters: list[Iteration] = []          # every settled iteration of every job
        self._queue: list[_Job] = []
        self._job: _Job | None = None
        self._done_jobs: list[_Job] = []
        self._t0 = math.nan
        self._initial: Setting | None = None
        self._current: Setting | None = None       # what the server runs, as far as we know
        self._incumbent: Setting | None = None
        self._rejected: set[Setting] = set()
        self._verified: set[Setting] = set()
        self._rounds = 0
        self._report_memo: tuple[tuple, dict[str, Any] | None] | None = None
        self._probed: set[Setting] = set()         # every setting queued as a probe
        self._completed = False                    # the completing probes ran (after the first A/B)
        self._then: str | None = None              # after completing: None = propose, else finish(why)
        self._probes = 0
        self._probe_cost = 0.0                      # the longest probe so far, change to done (s)
        self._planned = 1
        self._ab_jobs: list[_Job] = []
        self._first_job: _Job | None = None
        self._candidate: Prediction | None = None
        self._predicted_ratio = math.nan
        self._stop_reason = ""
        self._last_progress_t = math.nan

    @property
    def iterations(self) -> tuple[Iteration, ...]:
        """Every settled iteration of the measurements finished so far (any batch size): what
        `tune --schedule` pools over its loads to fit each batch bucket."""
        return tuple(self._iters)

    # ---- capabilities ----------------------------------------------------------------------
    def _settable(self, s: Setting) -> bool:
        c = self._caps
        if c is None:
            return True
        if s.steps > 0 and s.topk > 1 and not (c.can_set(TOPK)
                                               and c.can_set(DRAFT_TOKENS)):
            return False
        if s.steps > 0 and s.placement != SHARDED and not c.can_set(PLACEMENT):
            return False
        # An extra table knob the server cannot change live would be dropped from the request, so the
        # setting could never be measured as itself.
        return all(c.can_set(k.arg) for k in extra_knobs() if s.get(k) is not None)

    def _changes(self, s: Setting) -> dict[str, Any]:
        args = s.as_server_args()
        c = self._caps
        if c is not None:
            args = {k: v for k, v in args.items() if k == STEPS or c.can_set(k)}
        return args

    # ---- events ----------------------------------------------------------------------------
    def _emit(self, kind: str, now: float, data: Mapping[str, Any]) -> None:
        self.session.put(Event(now, kind, dict(data)))

    # ---- public control --------------------------------------------------------------------
    def start(self, now: float | None = None) -> None:
        now = self.session.now() if now is None else now
        self._t0 = now
        self.state = State.RUNNING
        self.status = "waiting for decode iterations (is load running?)"
        self._last_progress_t = now

    def cancel(self, now: float | None = None) -> None:
        if self.state is State.RUNNING:
            self._finish(self.session.now() if now is None else now, "cancelled")

    def close(self) -> None:
        self.feed.close()
        self.runner.shutdown()

    def apply(self, setting: Setting) -> Future:
        """Apply one setting now (the operator's pick from the table); blocking work on the runner."""
        def run() -> Any:
            res = self.session.set_config(self._changes(setting), by="operator")
            if res.ok:
                self._current = setting
            return res
        return self.runner.submit(run)

    def progress(self) -> float:
        if self.state is State.DONE:
            return 1.0
        if self.state is not State.RUNNING:
            return 0.0
        done = len(self._done_jobs)
        frac = done / max(self._planned, done + 1)
        elapsed = (self._last_progress_t - self._t0) / self.opts.budget_s if self.opts.budget_s else 0
        return max(0.0, min(0.99, max(frac, elapsed)))

    # ---- the state machine -----------------------------------------------------------------
    def step(self, now: float | None = None) -> bool:
        """Advance as far as the data allows; True while tuning goes on."""
        if self.state is not State.RUNNING:
            return False
        now = self.session.now() if now is None else now
        self._last_progress_t = now
        self._ingest(now)
        if self._initial is None:
            if now - self._t0 > self.opts.budget_s:
                self.state, self.stage = State.FAILED, Stage.FAILED
                self.status = "no decode iteration arrived: start load (or traffic) on the server"
                self._emit(TuningKind.PROBLEM, now, {"message": self.status})
                return False
            return True
        if now - self._t0 > self.opts.budget_s and self._stop_reason == "":
            self._stop_reason = "budget spent"
            self._queue = [j for j in self._queue if j.purpose is Purpose.APPLY]
            if self._job is not None and self._job.purpose is not Purpose.APPLY:
                self._job = None
            self._finish(now, "budget spent")
        for _ in range(8):                      # a few transitions per step at most
            if self._job is None:
                if self._queue:
                    self._job = self._queue.pop(0)
                elif self.state is State.RUNNING:
                    self._decide(now)
                    if self._job is None and not self._queue:
                        break
                    continue
                else:
                    break
            if not self._advance(self._job, now):
                break
            self._done_jobs.append(self._job)
            self._job = None
        return self.state is State.RUNNING

    def _ingest(self, now: float) -> None:
        job = self._job
        for rec in self.feed.poll():
            try:
                it = parse_record(rec)
            except ValueError as e:
                self.bad_records += 1
                if self.bad_records == 1:
                    self._emit(TuningKind.PROBLEM, now, {"message": str(e)})
                continue
            if self._initial is None:
                self._initial = it.setting
                self._current = it.setting
                self._incumbent = it.setting
                self._emit(TuningKind.STARTED, now, {
                    "initial": it.setting.to_json(), "budget_s": self.opts.budget_s,
                    "space": [s.to_json() for s in self.space],
                    "probes": [s.to_json() for s in probe_plan(self.space, it.setting)]})
                self.stage = Stage.PROBING
                # The starting setting first (no settling when nothing changed); then
                # tuner.tuning.probing picks each next probe from the fit.
                self._queue = [_Job(it.setting, Purpose.PROBE, self.opts.probe_s, self.opts.probe_min_iters)]
                self._probed = {it.setting}
                self._first_job = self._queue[0]
                self._planned = len(probe_plan(self.space, it.setting)) + 2 * self.opts.ab_pairs + 1
                job = None
            if job is None or not job.applied or job.measure_s <= 0:
                continue
            if not self._belongs(job, it):
                continue
            if job.seen == 0:
                job.first_t = it.t
            job.seen += 1
            if math.isnan(job.settled_at):
                # The same rule as observations.settle: iterations before this one, time since the first.
                if core_windows.settled(job.seen - 1, it.t - job.first_t, self.opts.settle_s, self.opts.settle_iters):
                    job.settled_at = now
                    job.end_at = now + job.measure_s
                continue
            job.iters.append(it)

    def _steady(self, now: float) -> bool:
        """No configuration change in the last settle_s seconds (as far as the session knows)."""
        store = getattr(self.session, "store", None)
        if store is None:
            return False
        last = store.last_event(EventKind.CONFIG_CHANGED, at=now)
        return last is None or now - last.t >= self.opts.settle_s

    @staticmethod
    def _belongs(job: _Job, it: Iteration) -> bool:
        if job.epoch is not None:
            return it.epoch == job.epoch
        return it.setting == job.setting

    def _advance(self, job: _Job, now: float) -> bool:
        """Move one job on; True when it is finished."""
        if not job.applied:
            if job.future is None:
                if job.setting == self._current:
                    job.applied, job.t_apply = True, now
                    if job is self._first_job and self._steady(now):
                        # The server ran this setting before tuning began: nothing to settle.
                        job.settled_at, job.end_at = now, now + job.measure_s
                else:
                    self.status = f"applying {job.setting.label()}"
                    job.future = self.runner.submit(self.session.set_config,
                                                    self._changes(job.setting), "tuner")
            if job.future is not None and not job.applied:
                if not job.future.done():
                    return False
                try:
                    res = job.future.result()
                    ok, reason, active = res.ok, res.reason, res.active
                except Exception as e:  # noqa: BLE001 - a transport error is a refusal here
                    ok, reason, active = False, str(e).splitlines()[0] if str(e) else type(e).__name__, None
                if not ok:
                    self._rejected.add(job.setting)
                    self.space = [s for s in self.space if s != job.setting]
                    self._emit(TuningKind.REFUSED, now, {"setting": job.setting.to_json(), "reason": reason})
                    return True
                self._current = job.setting
                job.applied, job.t_apply = True, now
                job.epoch = active_epoch(active)
            if job.measure_s <= 0:
                return True
        if math.isnan(job.settled_at) or now < job.end_at or len(job.iters) < job.min_iters:
            if job.seen == 0 and now - job.t_apply > self.opts.stall_s:
                self._emit(TuningKind.PROBLEM, now, {
                    "message": f"no decode iteration at {job.setting.label()} for "
                               f"{now - job.t_apply:.0f} s: is load running?"})
                job.t_apply = now
            self.status = (f"{self.stage}: {job.setting.label()} "
                           + ("settling" if math.isnan(job.settled_at) else f"{len(job.iters)} iterations"))
            return False
        self._complete(job, now)
        return True

    def _complete(self, job: _Job, now: float) -> None:
        self._iters.extend(job.iters)
        stats = [s for s in summarise(job.iters)]
        if stats:
            main = max(stats, key=lambda s: s.n)
            total_tok = sum(i.committed for i in job.iters)
            total_ms = sum(i.wall_ms for i in job.iters)
            tok_s = 1000.0 * total_tok / total_ms if total_ms else math.nan
            if job.purpose is Purpose.PROBE:
                self._probes += 1
                if job is not self._first_job:
                    self._probe_cost = max(self._probe_cost, now - job.t_apply)
            tok, ms = self._sums.get(job.setting, (0, 0.0))
            self._sums[job.setting] = (tok + total_tok, ms + total_ms)
            self.measured[job.setting] = 1000.0 * self._sums[job.setting][0] / self._sums[job.setting][1]
            self._emit(TuningKind.PROBE, now, {
                "setting": job.setting.to_json(), "purpose": job.purpose.value, "n": len(job.iters),
                "bs": main.bs, "tok_s": tok_s, "t0": job.settled_at, "t1": now,
                "terms_ms": {k: v[0] for k, v in main.terms.items()}})

    # ---- decisions -------------------------------------------------------------------------
    def _main_bs(self) -> int:
        counts: dict[int, int] = {}
        for it in self._iters:
            counts[it.bs] = counts.get(it.bs, 0) + 1
        return max(counts, key=lambda b: counts[b]) if counts else 1

    def _refit(self, now: float) -> None:
        self.model = fit_cost_model(summarise(self._iters), self.tp_size)
        bs = self._main_bs()
        self.predictions = self.model.predict_all(self.space, bs)
        top = best(self.predictions)
        self._emit(TuningKind.PREDICTION, now, {
            "bs": bs, "best": top.to_json() if top else None,
            "predictions": [p.to_json() for p in self.predictions],
            "model": self.model.to_json()})

    def _decide(self, now: float) -> None:
        match self.stage:
            case Stage.PROBING:
                self._refit(now)
                if self._probe_next(complete=False):
                    return
                self._propose(now)
            case Stage.COMPLETING:
                self._refit(now)
                if self._probe_next(complete=True):
                    return
                self.stage = Stage.PROPOSING
                then, self._then = self._then, None
                if then is None:
                    self._propose(now)
                else:
                    self._finish(now, then)
            case Stage.VERIFYING:
                self._judge(now)
            case Stage.FINISHING:
                self._done(now)

    def _probe_next(self, complete: bool) -> bool:
        """Queue what tuner.tuning.probing says could still change the answer (each setting once:
        a probe that saw another batch size is not repeated forever); False when nothing is left."""
        assert self.model is not None and self._initial is not None
        nxt = [s for s in next_probes(self.model, self.space, self._initial, self._main_bs(),
                                      self.opts.noise_floor, complete)
               if s not in self._probed and s not in self._rejected]
        if not nxt:
            return False
        self._probed.update(nxt)
        self._queue = [_Job(s, Purpose.PROBE, self.opts.probe_s, self.opts.probe_min_iters) for s in nxt]
        self._planned += len(nxt)
        return True

    def _predicted(self, s: Setting) -> Prediction | None:
        for p in self.predictions:
            if p.setting == s:
                return p
        return None

    def _propose(self, now: float) -> None:
        # The first A/B is against what the server ran before tuning (so the verified gain is the
        # gain the operator gets); later ones against the last verified winner.
        assert self._incumbent is not None
        pool = [p for p in self.predictions
                if p.setting not in self._rejected and p.setting not in self._verified]
        if not self.opts.objective.plain:
            return self._propose_for_objective(now, pool)
        cand = best(pool)
        inc_pred = self._predicted(self._incumbent)
        if cand is None or cand.setting == self._incumbent:
            return self._lead_or_stop(now, "the previous best is the predicted best"
                                      if self._rounds else "the starting setting is the predicted best")
        if inc_pred is not None and inc_pred.tok_s:
            gain = cand.tok_s / inc_pred.tok_s - 1           # type: ignore[operator]
        else:
            gain = math.inf
        if gain < self.opts.noise_floor:
            return self._lead_or_stop(now, f"next candidate predicted {gain * 100:+.1f} %, within noise")
        return self._start_ab(now, cand, gain, inc_pred)

    def _acceptance_p(self) -> tuple[float, ...]:
        return tuple(self.model.acceptance.p) if self.model is not None else ()

    def _propose_for_objective(self, now: float, pool: list[Prediction]) -> None:
        """The objective's pick (tuner.tuning.slo.Objective.pick) against the incumbent: A/B'd when
        it is predicted to do better by the objective beyond the noise floor."""
        assert self._incumbent is not None
        obj, p = self.opts.objective, self._acceptance_p()
        cand, _meets = obj.pick(pool, p)
        inc_pred = self._predicted(self._incumbent)
        if cand is None or cand.setting == self._incumbent:
            return self._next_round(now, "the previous best is the predicted best" if self._rounds
                                    else "the starting setting is the predicted best")
        q = obj.itl_q()
        c_itl = predicted_itl(cand, p, q)[0]
        i_itl = predicted_itl(inc_pred, p, q)[0] if inc_pred is not None else math.nan
        term = obj.itl_term
        if obj.kind == LATENCY or (term is not None and math.isfinite(i_itl) and i_itl > term.limit_s):
            # Latency first (or the incumbent is predicted over the SLO): the gain is in p99 ITL.
            gain = i_itl / c_itl - 1 if c_itl > 0 and math.isfinite(i_itl) else math.inf
        elif inc_pred is not None and inc_pred.tok_s:
            gain = cand.tok_s / inc_pred.tok_s - 1           # type: ignore[operator]
        else:
            gain = math.inf
        if gain < self.opts.noise_floor:
            return self._next_round(now, f"next candidate predicted {gain * 100:+.1f} % by the objective, "
                                         "within noise")
        return self._start_ab(now, cand, gain, inc_pred)

    def _figures(self, jobs: Sequence[_Job] | None = None, setting: Setting | None = None) -> dict[str, float]:
        """Measured latency figures {itl_p99: s, ...} of the objective's terms: ITL from the phase
        records of `jobs` (or every settled iteration of `setting`), TTFT/queue/e2e from the load
        driver's requests timed wholly inside those spans."""
        from tuner.core import latency as L
        obj = self.opts.objective
        if jobs is not None:
            iters = [i for j in jobs for i in j.iters]
            spans = [(j.settled_at, j.end_at) for j in jobs if math.isfinite(j.settled_at)]
        else:
            iters = [i for i in self._iters if i.setting == setting]
            spans = [(j.settled_at, j.end_at) for j in self._done_jobs
                     if j.setting == setting and math.isfinite(j.settled_at) and j.measure_s > 0]
        out: dict[str, float] = {}
        names = {t.name for t in obj.slo} | {f"itl_p{round(obj.itl_q() * 100)}"}
        for name in names:
            kind, q = name.split("_p")[0], int(name.split("_p")[1]) / 100
            if kind == "itl":       # as the SLO is read: window after window (slo.windowed_itl)
                out[name] = windowed_itl(iters, q)
            else:
                store = getattr(self.session, "store", None)
                evs = store.events(EventKind.LOAD_REQUEST) if store is not None else []
                reqs = [r for a, b in spans for r in L.requests_in(evs, a, b)]
                out[name] = L.figure(reqs, kind, q)
        return out

    def _judge_objective(self, c_jobs: Sequence[_Job], i_jobs: Sequence[_Job], tok_verdict: str
                         ) -> tuple[str, dict[str, Any]]:
        """The verdict under the objective, with its figures: latency compares the p99 ITL of 1-s
        windows (ratio of medians, bootstrap interval); an SLO: meeting it beats missing it, both
        meeting is the tok/s verdict, both missing goes to the nearer."""
        obj = self.opts.objective
        fc, fi = self._figures(c_jobs), self._figures(i_jobs)
        mc, mi = obj.meets(fc), obj.meets(fi)
        info: dict[str, Any] = {"objective": obj.to_json(), "candidate_figures": fc, "incumbent_figures": fi,
                                "candidate_meets": mc, "incumbent_meets": mi}
        if obj.kind == LATENCY:
            q = obj.itl_q()
            cw, iw = self._itl_windows(c_jobs, q), self._itl_windows(i_jobs, q)
            if len(cw) < 2 or len(iw) < 2:
                return "same", info
            ratio, lo, hi = core_windows.ratio_of_medians(iw, cw)     # p99 ITL candidate / incumbent
            info.update(itl_ratio=ratio, itl_lo=lo, itl_hi=hi)
            # A higher ITL is worse: the tok/s words turn round.
            return {core_windows.BETTER: "worse", core_windows.WORSE: "better"}.get(
                core_windows.judge(lo, hi), "same"), info
        if mc is None or mi is None:
            return "same", info
        if mc and not mi:
            return "better", info
        if mi and not mc:
            return "worse", info
        if mc and mi:
            return tok_verdict, info
        dc, di = obj.miss(fc), obj.miss(fi)
        return ("better" if dc < di else "worse" if dc > di else "same"), info

    def _itl_windows(self, jobs: Sequence[_Job], q: float) -> list[float]:
        """The q-quantile ITL of each 1-s window of the jobs' phase records."""
        from tuner.core.latency import percentile
        out: list[float] = []
        for j in jobs:
            if not j.iters:
                continue
            t0, width = j.iters[0].t, core_windows.WINDOW_S
            for w in range(int((j.iters[-1].t - t0) // width)):
                v = itl_values(i for i in j.iters if t0 + w * width <= i.t < t0 + (w + 1) * width)
                if v:
                    out.append(percentile(v, q))
        return out

    def objective_report(self) -> dict[str, Any] | None:
        """The objective's figures so far, as the result will carry them (None under plain
        throughput), for the tune screen while tuning runs. Recomputed only when a measurement, a
        prediction or (for TTFT/queue/e2e terms) a request was added: the screen asks on every tick."""
        obj = self.opts.objective
        if obj.plain:
            return None
        store = getattr(self.session, "store", None)
        rate_terms = any(t.kind != "itl" for t in obj.judged)
        key = (len(self._iters), len(self._done_jobs), len(self.measured), id(self.model),
               len(self.predictions), getattr(store, "events_added", 0) if rate_terms else 0)
        if self._report_memo is None or self._report_memo[0] != key:
            self._report_memo = (key, self._objective_report())
        return self._report_memo[1]

    def _objective_report(self) -> dict[str, Any] | None:
        """For the result: the objective, each measured setting's figures (predicted and measured
        ITL, tok/s, whether it meets the SLO), every predicted setting's ITL and, when no setting
        met it, the nearest."""
        obj = self.opts.objective
        if obj.plain:
            return None
        p, q = self._acceptance_p(), obj.itl_q()
        predicted = []
        for pred in self.predictions:
            pi, psd = predicted_itl(pred, p, q)
            if math.isfinite(pi):
                predicted.append({**pred.setting.to_json(), "predicted_itl": pi,
                                  "predicted_itl_sd": None if math.isnan(psd) else psd})
        rows = []
        for s in sorted(self.measured, key=lambda x: x.label()):
            f = self._figures(setting=s)
            pred = self._predicted(s)
            pi, psd = predicted_itl(pred, p, q) if pred is not None else (math.nan, math.nan)
            rows.append({**s.to_json(), "tok_s": self.measured[s], "figures": f, "meets": obj.meets(f),
                         "predicted_itl": None if math.isnan(pi) else pi,
                         "predicted_itl_sd": None if math.isnan(psd) else psd})
        met = [r for r in rows if r["meets"]]
        out: dict[str, Any] = {**obj.to_json(), "itl": f"itl_p{round(q * 100)}", "settings": rows,
                               "predicted": predicted, "met": bool(met) if obj.slo else None}
        if obj.slo and not met and rows:
            out["nearest"] = min(rows, key=lambda r: obj.miss(r["figures"]))
        return out

    def _lead_or_stop(self, now: float, reason: str) -> None:
        """The model has nothing better to try: a setting measured clearly faster than the incumbent
        is judged by an A/B first (a measurement beats the model); else stop with `reason`."""
        lead = self._measured_lead()
        found = self._predicted(lead[0]) if lead is not None else None
        if lead is None or found is None or not self._ab_budget_left(now):
            return self._next_round(now, reason)
        return self._start_ab(now, found, lead[1] - 1, self._predicted(self._incumbent) if self._incumbent else None)

    def _measured_lead(self) -> tuple[Setting, float] | None:
        """The measured setting furthest ahead of the incumbent beyond `measured_margin`, not yet
        judged by an A/B (ratio of probe tok/s), or None."""
        inc = self._incumbent
        base = self.measured.get(inc) if inc is not None else None
        if not base or base <= 0:
            return None
        leads = [(s, v / base) for s, v in self.measured.items()
                 if s != inc and s in self.space and s not in self._rejected and s not in self._verified
                 and v / base > 1 + self.opts.measured_margin]
        return max(leads, key=lambda x: x[1]) if leads else None

    def _ab_budget_left(self, now: float) -> bool:
        """Whether one more verification (its pairs, each segment settled) and the held-back probes
        fit in the budget."""
        one = self.opts.ab_pairs * 2 * (self.opts.settle_s + self.opts.ab_segment_s)
        return now - self._t0 + one + self._completion_reserve() < self.opts.budget_s

    def _start_ab(self, now: float, cand: Prediction, gain: float, inc_pred: Prediction | None) -> None:
        assert self._incumbent is not None
        if self._rounds >= self.opts.max_rounds:
            return self._finish(now, f"{self.opts.max_rounds} verifications done")
        self._candidate = cand
        # Judged later against the prediction made now, before the A/B's own data refine the fit.
        self._predicted_ratio = gain + 1 if math.isfinite(gain) else math.nan
        self._emit(TuningKind.APPLIED, now, {
            "setting": cand.setting.to_json(), "predicted_tok_s": cand.tok_s, "sd": cand.sd,
            "basis": cand.basis, "incumbent": self._incumbent.to_json(),
            "incumbent_predicted_tok_s": inc_pred.tok_s if inc_pred else None,
            "predicted_gain": gain if math.isfinite(gain) else None})
        self.stage = Stage.VERIFYING
        self._ab_jobs = []
        for _ in range(self.opts.ab_pairs):
            for s, purpose in ((cand.setting, Purpose.CANDIDATE), (self._incumbent, Purpose.INCUMBENT)):
                job = _Job(s, purpose, self.opts.ab_segment_s, 1)
                self._ab_jobs.append(job)
                self._queue.append(job)
        self._planned += len(self._ab_jobs)

    def _windows(self, c_jobs: Sequence[_Job], i_jobs: Sequence[_Job]
                 ) -> tuple[list[float], list[float], str]:
        """1-s windows of decode tok/s over each side's measured spans: the session's throughput
        series when it has enough readings on both sides, else tokens committed per second of the
        phase records (server time). Time that belongs to no setting (an outage, a profiler capture
        the operator took meanwhile, each with its settling: timeline.excluded) is left out of both,
        as the A/B panel leaves it out: a capture slows the server for seconds."""
        series = self.session.throughput_series() if hasattr(self.session, "throughput_series") else ""
        store = getattr(self.session, "store", None)
        away = timeline.excluded(store, self.opts.settle_s, self.opts.settle_iters) if store is not None else []
        if store is not None and series:
            sides = [[w for j in jobs for w in timeline.window_means(store, series, j.settled_at, j.end_at,
                                                                     exclude=away)]
                     for jobs in (c_jobs, i_jobs)]
            if core_windows.enough(*sides):
                return sides[0], sides[1], series

        def from_records(jobs: Sequence[_Job]) -> list[float]:
            out: list[float] = []
            width = core_windows.WINDOW_S
            for j in jobs:
                if not j.iters:
                    continue
                t0 = j.iters[0].t
                for w in range(int((j.iters[-1].t - t0) // width)):
                    a, b = t0 + w * width, t0 + (w + 1) * width
                    if any(x < b and a < y for x, y in away):
                        continue
                    out.append(sum(i.committed for i in j.iters if a <= i.t < b) / width)
            return out
        return from_records(c_jobs), from_records(i_jobs), "phase/committed_per_s"

    def _judge(self, now: float) -> None:
        assert self._candidate is not None and self._incumbent is not None
        cand, inc = self._candidate.setting, self._incumbent
        c_jobs = [j for j in self._ab_jobs if j.purpose is Purpose.CANDIDATE]
        i_jobs = [j for j in self._ab_jobs if j.purpose is Purpose.INCUMBENT]
        cw, iw, series = self._windows(c_jobs, i_jobs)
        if len(cw) < 2 or len(iw) < 2:
            # Time left out (a capture, an outage) can take a whole segment: measure another pair.
            if self._another_pair_fits(now, c_jobs):
                return self._another_pair(cand, inc)
            self._rounds += 1
            self._emit(TuningKind.PROBLEM, now, {"message": "A/B had too few tok/s windows to compare"})
            return self._finish(now, "A/B without data")
        ratio, lo, hi = core_windows.ratio_of_medians(iw, cw)
        if lo <= 1 <= hi and self.opts.objective.plain and self._another_pair_fits(now, c_jobs):
            # Not decided yet: one more interleaved pair narrows the interval.
            return self._another_pair(cand, inc)
        self._rounds += 1
        self._refit(now)
        pr = self._predicted_ratio
        verdict = {core_windows.BETTER: "better", core_windows.WORSE: "worse"}.get(core_windows.judge(lo, hi), "same")
        judged: dict[str, Any] = {}
        if not self.opts.objective.plain:
            verdict, judged = self._judge_objective(c_jobs, i_jobs, verdict)
        outcome = ABOutcome(cand, inc, verdict, ratio, lo, hi, pr, len(cw), len(iw), series)
        self.verifications.append(outcome)
        self._emit(TuningKind.VERIFIED, now, {**outcome.to_json(), **judged})
        if verdict == "better":
            self._verified.add(cand)
            self._incumbent = cand
            return self._next_round(now, None)
        if verdict == "worse":
            self._rejected.add(cand)
            self._emit(TuningKind.ROLLED_BACK, now, {"setting": cand.to_json(), "to": inc.to_json(),
                                                     "reason": f"measured {(ratio - 1) * 100:+.1f} % "
                                                               f"[{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]"
                                                     if self.opts.objective.plain else _objective_words(judged)})
            return self._next_round(now, None)
        # Within noise: keep the previous best (no change is the cheaper bet), and while the budget
        # allows another A/B, try the next-best candidate rather than stopping on one tie.
        self._rejected.add(cand)
        reason = (f"next candidate measured {(ratio - 1) * 100:+.1f} % "
                  f"[{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}], within noise")
        return self._next_round(now, None if self._ab_budget_left(now) else reason)

    def _another_pair_fits(self, now: float, c_jobs: Sequence[_Job]) -> bool:
        return len(c_jobs) < self.opts.ab_max_pairs and now - self._t0 + 2 * (
            self.opts.settle_s + self.opts.ab_segment_s) + self._completion_reserve() < self.opts.budget_s

    def _another_pair(self, cand: Setting, inc: Setting) -> None:
        """One more interleaved candidate/incumbent pair for the running A/B."""
        for s, purpose in ((cand, Purpose.CANDIDATE), (inc, Purpose.INCUMBENT)):
            job = _Job(s, purpose, self.opts.ab_segment_s, 1)
            self._ab_jobs.append(job)
            self._queue.append(job)
        self._planned += 2

    def _unverified_leads(self, best_s: Setting) -> tuple[tuple[Setting, float], ...]:
        base = self.measured.get(best_s)
        if not base or base <= 0:
            return ()
        judged = self._rejected | self._verified
        return tuple(sorted(((s, v / base) for s, v in self.measured.items()
                             if s != best_s and s not in judged and v / base > 1 + self.opts.measured_margin),
                            key=lambda x: -x[1]))

    def _completion_reserve(self) -> float:
        """Seconds the held-back probes will take (each as long as the longest probe so far): an
        extra A/B pair must leave them room in the budget, or the table stays incomplete."""
        if self._completed or self.model is None or self._initial is None:
            return 0.0
        pending = [s for s in next_probes(self.model, self.space, self._initial, self._main_bs(),
                                          self.opts.noise_floor, complete=True)
                   if s not in self._probed and s not in self._rejected]
        return len(pending) * self._probe_cost

    def _next_round(self, now: float, finish: str | None) -> None:
        """After a verdict: once, first measure what only completes the table (the probes that could
        not change the first proposal, held back so it came sooner); then propose again, or finish
        with `finish` as the reason."""
        if not self._completed:
            self._completed = True
            if self._probe_next(complete=True):
                self.stage, self._then = Stage.COMPLETING, finish
                return
        self.stage = Stage.PROPOSING
        if finish is None:
            return self._propose(now)
        return self._finish(now, finish)

    def _finish(self, now: float, reason: str) -> None:
        if self.stage is Stage.FINISHING or self.state is not State.RUNNING:
            return
        self._stop_reason = self._stop_reason or reason
        self.stage = Stage.FINISHING
        settled = self.opts.objective.settle_best(self._incumbent, self.measured, lambda s: self._figures(setting=s))
        if settled != self._incumbent:
            why = ("it meets the SLO, {} (the last verdicts' pick) misses it"
                   if self.opts.objective.meets(self._figures(setting=settled)) else
                   "no measured setting meets the SLO and it is the nearest, {} (the last verdicts' pick) misses "
                   "it by more")
            self._emit(TuningKind.PROBLEM, now, {"message": f"{settled.label()} ends the tuning: "
                                                            + why.format(self._incumbent.label())})
            self._incumbent = settled
        target = self._incumbent if self.opts.apply_best else self._initial
        if target is not None and target != self._current:
            self._queue.append(_Job(target, Purpose.APPLY, 0.0, 0))

    def _done(self, now: float) -> None:
        if self.model is None and self._iters:
            self._refit(now)
        best_s = self._incumbent or self._initial
        assert best_s is not None and self._initial is not None
        ao = None
        if self.model is not None and self.model.acceptance.depth:
            bs = self._main_bs()
            pick = acceptance_only_pick(self.model.acceptance, bs)
            ao = Setting(pick, placement=self._initial.placement)
        bs = self._main_bs()
        self.result = TuningResult(
            initial=self._initial, best=best_s, applied=self._current or self._initial,
            bs=bs, stop_reason=self._stop_reason, elapsed_s=now - self._t0,
            probes=self._probes, verifications=tuple(self.verifications),
            predictions=tuple(self.predictions), model=self.model, acceptance_only=ao,
            measured_tok_s=dict(self.measured),
            advice=derive_advice(best_s, self.predictions, self.model, ao, bs),
            unverified_leads=self._unverified_leads(best_s) if self.opts.objective.plain else (),
            objective=self._objective_report())
        report = self.result.objective
        if report is not None and report.get("met") is False and report.get("nearest"):
            near = report["nearest"]
            self._emit(TuningKind.PROBLEM, now, {
                "message": f"no setting measured meets the SLO {','.join(report['slo'])}; nearest: "
                           f"{Setting.from_json(near).label()} ({_figure_words(near['figures'])}, "
                           f"{near['tok_s']:.1f} tok/s)"})
        self._emit(TuningKind.FINISHED, now, self.result.to_json())
        self.state = State.DONE
        self.stage = Stage.DONE
        # The outcome's words are the result line's (tuner.tuning.summary), shown beside this.
        self.status = f"done after {now - self._t0:.0f} s"


def _figure_words(f: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(f.items()) if isinstance(v, float) and math.isfinite(v))


def _objective_words(judged: Mapping[str, Any]) -> str:
    """Why a candidate lost under the objective, in a line."""
    return (f"by the objective: {_figure_words(judged.get('candidate_figures', {}))} against "
            f"{_figure_words(judged.get('incumbent_figures', {}))}")
