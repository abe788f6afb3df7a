"""Which settings the live tuner measures next, from what the fit knows so far.

Every probe costs the settle rule (tuner.core.windows: 2 s and 20 iterations) plus its measurement,
so the tuner measures only what can change its answer, most useful first, and proposes as soon as
nothing more could:

1. The starting setting (the live tuner measures it first; it needs no settling when nothing
   changed).
2. The *lead* placement: the one whose best predictable setting is fastest. After the first probe
   that is the what-if's call (the starting placement's collectives removed); with collectives
   untimed it stays the starting placement. In the lead placement: the deepest chain (acceptance at
   every position of the space) and a second depth (the cost lines need two), plus one mid tree per
   topk in the space.
3. Then whatever could still beat the best fitted prediction by more than the noise floor:
   - a placement never measured whose what-if beats it (every one when the collectives ran untimed,
     inside CUDA graphs: no what-if exists, so they are measured rather than assumed free), at its
     deepest and shallowest chain;
   - a placement measured at one depth only (the starting one, when the lead moved away) whose
     measured setting is within noise of the lead placement's prediction at the same depth: its
     deepest chain;
   - speculation off, when even two standard errors above its (extrapolated) prediction it reaches
     the best.
4. `complete=True` (after the first verification, so the proposal is not held up by it): the
   second depth of every placement measured at one depth, so every setting has a prediction and the
   SGLang export (the best sharded chain) is fitted, not guessed.

Pure: reads a fitted CostModel and the space; it never measures, sleeps or talks to a server.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from probes.names import SHARDED
from tuner.core.setting import PLACEMENTS
from tuner.tuning.cost_model import CostModel, Prediction, best
from tuner.tuning.settings import Setting


def _chains(space: Iterable[Setting], placement: str) -> list[int]:
    return sorted({s.steps for s in space if s.topk == 1 and s.steps > 0 and s.placement == placement})


def _chain(space: Sequence[Setting], steps: int, placement: str) -> Setting:
    """The chain of the space at this depth and placement (with extra knobs, the first of them)."""
    return min((s for s in space if s.topk == 1 and s.steps == steps and s.placement == placement),
               key=lambda s: s.extra)


def _measured(model: CostModel, placement: str, bs: int) -> set[Setting]:
    g = model.groups.get((placement, bs))
    return set(g.settings) if g is not None else set()


def _depths(model: CostModel, placement: str, bs: int) -> set[int]:
    return {s.steps for s in _measured(model, placement, bs) if s.topk == 1}


def lead_placement(model: CostModel, space: Sequence[Setting], initial: Setting, bs: int,
                   noise_floor: float = 0.02) -> str:
    """The placement of the fastest speculative setting with a fitted prediction, unless a what-if
    (a placement never measured) beats it by more than the noise floor; the starting placement
    when nothing is predictable."""
    preds = model.predict_all([s for s in space if s.steps > 0], bs)
    top = best(p for p in preds if p.basis != "what-if")
    guess = best(p for p in preds if p.basis == "what-if")
    if guess is not None and (top is None or guess.tok_s > top.tok_s * (1 + noise_floor)):  # type: ignore[operator]
        return guess.setting.placement
    if top is not None:
        return top.setting.placement
    return initial.placement if initial.steps > 0 else SHARDED


def _deep_then_shallow(model: CostModel, space: Sequence[Setting], placement: str, bs: int) -> list[Setting]:
    """The deepest chain of a placement, then its shallowest, leaving out depths already measured,
    until it has two depths (its cost lines need two)."""
    chains = _chains(space, placement)
    have = _depths(model, placement, bs)
    out: list[Setting] = []
    for st in (chains[-1:] + chains[:1]) if chains else []:
        if len(have) >= 2:
            break
        if st not in have:
            out.append(_chain(space, st, placement))
            have.add(st)
    return out


def next_probes(model: CostModel, space: Sequence[Setting], initial: Setting, bs: int,
                noise_floor: float = 0.02, complete: bool = False) -> list[Setting]:
    """The settings to measure next, in order (empty: nothing more can change the answer)."""
    lead = lead_placement(model, space, initial, bs, noise_floor)
    out = _deep_then_shallow(model, space, lead, bs)
    measured_lead = _measured(model, lead, bs)
    for k in sorted({s.topk for s in space if s.topk > 1}):
        if any(s.topk == k for s in measured_lead):
            continue
        trees = sorted((s for s in space if s.topk == k and s.placement == lead),
                       key=lambda s: (s.steps, s.num_draft_tokens))
        if trees:
            out.append(trees[len(trees) // 2])
    if out:
        return _in_space(out, space)

    preds = model.predict_all(space, bs)
    top = best(p for p in preds if p.basis != "what-if" and p.setting.steps > 0)
    if top is None or top.tok_s is None:
        return []
    for placement in sorted({s.placement for s in space if s.steps > 0} - {lead}, key=PLACEMENTS.index):
        have = _depths(model, placement, bs)
        if len(have) >= 2:
            continue
        if not have:
            w = model.what_if(top.setting, bs, placement) if placement != SHARDED else None
            unknown = w is None and model.comm_untimed(bs)
            if unknown or (w is not None and w.tok_s > top.tok_s * (1 + noise_floor)):
                out += _deep_then_shallow(model, space, placement, bs)
            continue
        if complete or _could_win(model, placement, lead, bs, noise_floor):
            out += _deep_then_shallow(model, space, placement, bs)
    off = Setting(0)
    if off in space and not _off_measured(model, bs):
        p = _predicted(preds, off)
        if p is None or p.tok_s is None or not math.isfinite(p.sd) \
                or p.tok_s + 2 * p.sd >= top.tok_s * (1 - noise_floor):
            out.append(off)
    return _in_space(out, space)


def _could_win(model: CostModel, placement: str, lead: str, bs: int, noise_floor: float) -> bool:
    """A placement measured at one depth: is it within noise of the lead placement there?"""
    for s in _measured(model, placement, bs):
        if s.topk != 1:
            continue
        here = model.predict(s, bs)
        there = model.predict(Setting(s.steps, s.topk, s.num_draft_tokens, lead, s.extra), bs)
        if here.tok_s is None or there.tok_s is None:
            return True
        if here.tok_s >= there.tok_s * (1 - noise_floor):
            return True
    return False


def _off_measured(model: CostModel, bs: int) -> bool:
    g = model.groups.get((SHARDED, bs))
    return g is not None and g.off is not None


def _predicted(preds: Sequence[Prediction], s: Setting) -> Prediction | None:
    for p in preds:
        if p.setting == s:
            return p
    return None


def _in_space(settings: Sequence[Setting], space: Sequence[Setting]) -> list[Setting]:
    allowed = set(space)
    return [s for s in dict.fromkeys(settings) if s in allowed]
