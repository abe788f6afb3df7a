"""What the TUI's tune key starts: the search space this server can change live, and a live Tuner
over the session, or one line saying why not.

The space is tuning.settings.tune_space (the `tune` command's rule too) over the knobs the backend
can set live. Must not drive the tuner (the headless driver steps it) nor touch a widget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes.names import STEPS
from tuner.core import control
from tuner.tuning.live import Tuner, TunerOptions, TuningError
from tuner.tuning.settings import Setting, tune_space
from tuner.tuning.slo import Objective


@dataclass
class TuneRequest:
    budget_s: float = 120.0
    max_steps: int = 5
    topks: tuple[int, ...] = (1,)
    draft_tokens: tuple[int, ...] = ()
    placements: tuple[str, ...] | None = None
    """None: every placement the server can set live."""
    objective: Objective = field(default_factory=Objective)
    """What the tuner's proposals and verdicts judge (attach --tune-objective / --tune-slo)."""

    def space(self, backend: Any) -> list[Setting]:
        """The settings to tune over on `backend`, up to `max_steps` deep, speculation off included."""
        return tune_space(lambda arg: not control.why_not(backend, arg), self.max_steps, self.topks,
                          self.draft_tokens, self.placements, include_off=True,
                          steps_allowed=control.allowed_values(backend, STEPS))

    def tuner(self, session: Any) -> tuple[Tuner | None, str]:
        """A Tuner over `session`, or None and why not (one line)."""
        backend = session.backend
        if backend is None:
            return None, "no server to tune"
        reason = control.why_not(backend, STEPS)
        if reason:
            return None, f"the tuner changes steps live, and {reason}"
        try:
            return Tuner(session, self.space(backend), TunerOptions(budget_s=self.budget_s, objective=self.objective)), ""
        except TuningError as e:
            return None, str(e)
