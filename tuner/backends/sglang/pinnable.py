"""The step tiers an SGLang server's plugin can pin, as it publishes them in `/server_info`.

The plugin (probes/inserver/sglang_steps.pinnable_info) puts `specdecode_pinnable_steps` in each
`internal_states[i]`: the launch's tier, the captured graph sizes, each tier's batch-size ranges
where a pin holds (SGLang's own routing), and every slot's candidates and knobs. This module reads
that (server data: malformed parts read as absent, never raise) and words it for people: which steps
can be offered, where a partial one holds, and what to do about a missing one.

Pure: no HTTP, no textual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes.names import PINNABLE_STEPS
from probes.sglang_tiers import Ranges, everywhere, ranges_text

FLAGS_FIX = "`specdecode-tune sglang-flags --from URL --steps {steps}` writes the config and flags to relaunch with"


@dataclass(frozen=True)
class Pinnable:
    max_bs: int
    launch: int | None
    steps: dict[int, Ranges]                      # tier -> where a pin holds (non-empty only)
    slots: tuple[tuple[int, tuple[int, ...]], ...]
    graph_bs: tuple[int, ...] | None = None
    slot_knobs: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def allowed(self) -> tuple[int, ...]:
        return tuple(sorted(self.steps))

    def partial(self) -> dict[int, str]:
        """Tiers that hold at some batch sizes only -> "bs 1-7"."""
        return {s: ranges_text(r) for s, r in sorted(self.steps.items()) if not everywhere(r, self.max_bs)}

    def slots_text(self) -> str:
        return ", ".join(f"bs ≥ {bs}: {list(c)}" for bs, c in self.slots)

    def refusal(self, step: int) -> str:
        """Why `step` cannot be pinned here, and the fix."""
        listed = [bs for bs, c in self.slots if step in c]
        where = (f"only slots above this server's {self.max_bs} requests list it"
                 if listed else "no batch-size slot lists it")
        return (f"steps {step} cannot be pinned on this launch: {where} (slots {self.slots_text()}); "
                f"pinnable: {', '.join(map(str, self.allowed)) or 'none'}; fix: "
                + FLAGS_FIX.format(steps=",".join(map(str, sorted({*self.allowed, step})))))


def _ranges(v: Any) -> Ranges | None:
    if not isinstance(v, list):
        return None
    out: Ranges = []
    for r in v:
        if (not isinstance(r, list) or len(r) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                             for x in r) or r[0] > r[1]):
            return None
        out.append([int(r[0]), int(r[1])])
    return out


def parse(state: dict[str, Any]) -> Pinnable | None:
    """The plugin's published tiers from one `internal_states[i]`, or None when absent/malformed."""
    raw = state.get(PINNABLE_STEPS) if isinstance(state, dict) else None
    if not isinstance(raw, dict):
        return None
    max_bs, steps_raw, slots_raw = raw.get("max_bs"), raw.get("steps"), raw.get("slots")
    if not isinstance(max_bs, int) or not isinstance(steps_raw, dict) or not isinstance(slots_raw, list):
        return None
    steps: dict[int, Ranges] = {}
    for k, v in steps_raw.items():
        r = _ranges(v)
        if not str(k).isdigit() or r is None:
            return None
        if r:
            steps[int(k)] = r
    slots: list[tuple[int, tuple[int, ...]]] = []
    knobs: dict[int, dict[str, float]] = {}
    for sl in slots_raw:
        if not isinstance(sl, dict) or not isinstance(sl.get("bs"), int) or not isinstance(sl.get("candidate_steps"), list):
            return None
        cands = sl["candidate_steps"]
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in cands):
            return None
        slots.append((int(sl["bs"]), tuple(sorted(int(c) for c in cands))))
        knobs[int(sl["bs"])] = {k: v for k, v in sl.items() if k not in ("bs", "candidate_steps")
                                and isinstance(v, (int, float)) and not isinstance(v, bool)}
    launch = raw.get("launch")
    graph_bs = raw.get("graph_bs")
    return Pinnable(
        max_bs=max_bs, launch=launch if isinstance(launch, int) else None, steps=steps,
        slots=tuple(sorted(slots)), slot_knobs=knobs,
        graph_bs=tuple(int(b) for b in graph_bs) if isinstance(graph_bs, list)
        and all(isinstance(b, int) for b in graph_bs) else None)
