"""The space the tuner searches, built from the knob table (`tuner.core.setting`).

One rule for the TUI's tune key and the `tune` command: chains 1..max_steps, tier 0, trees for each
topk > 1 × draft-token count when the server can change both live, every placement it can set live,
and each extra table knob's `tune` values when it can change that knob live. This module only
describes settings; it never talks to a server and never measures anything.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from probes.names import DRAFT_TOKENS, PLACEMENT, SHARDED, STEPS, TOPK
from tuner.core import setting as vocab
from tuner.core.setting import PLACEMENTS, Setting, setting_problem  # noqa: F401  (re-exported)


def settings_space(max_steps: int = 7, topks: Iterable[int] = (1,),
                   draft_tokens: Iterable[int] = (), placements: Iterable[str] = (SHARDED,),
                   include_off: bool = True) -> list[Setting]:
    """Every valid setting: chains 1..max_steps, trees for each topk>1 and each N in draft_tokens."""
    out: list[Setting] = []
    if include_off:
        out.append(Setting(0))
    for placement in placements:
        for k in sorted(set(topks)):
            for s in range(1, max_steps + 1):
                if k == 1:
                    out.append(Setting(s, 1, s + 1, placement))
                    continue
                for n in sorted(set(draft_tokens)):
                    try:
                        out.append(Setting(s, k, n, placement))
                    except ValueError:
                        continue  # N beyond this tree's candidate pool
    # Settings are unique by value; keep a stable order.
    return sorted(set(out), key=lambda x: (PLACEMENTS.index(x.placement), x.topk, x.steps,
                                           x.num_draft_tokens, x.extra))


def tune_space(can_set: Callable[[str], bool], max_steps: int, topks: Iterable[int] = (1,),
               draft_tokens: Iterable[int] = (), placements: Iterable[str] | None = None,
               include_off: bool = True, steps_allowed: Iterable[int] | None = None) -> list[Setting]:
    """The tuner's space for a server that can change the knobs `can_set` says (server-arg names).

    placements: the ones to consider (None: every one the server can set live; sharded always).
    Trees need both topk and the draft-token count settable live; an extra knob is swept over its
    `tune` values only when settable live, else the server keeps its value. steps_allowed: the only
    step counts the server takes live (SGLang: the tiers its plugin can pin), None for any.
    """
    chosen = [p for p in (placements or PLACEMENTS) if p == SHARDED or can_set(PLACEMENT)]
    trees = can_set(TOPK) and can_set(DRAFT_TOKENS) and bool(list(draft_tokens))
    allowed = None if steps_allowed is None else set(steps_allowed)
    if allowed is not None:
        max_steps = max([s for s in allowed if s <= max_steps] or [0])
    space = settings_space(max_steps, sorted(set(topks) | {1}) if trees else [1],
                           list(draft_tokens) if trees else [], chosen, include_off)
    if allowed is not None:
        space = [x for x in space if x.steps in allowed]
    extras = {k.key: k.tune for k in vocab.extra_knobs() if k.tune and can_set(k.arg)}
    return sorted(vocab.with_extras(space, extras),
                  key=lambda x: (PLACEMENTS.index(x.placement), x.topk, x.steps, x.num_draft_tokens, x.extra))


def steps_left_out(caps: Any, max_steps: int) -> str:
    """What `tune` says when the server takes only some steps live (SGLang: the pinnable tiers):
    the steps 1..max_steps it leaves out, with the server's reason and the fix; "" when none."""
    allowed = caps.allowed_values(STEPS)
    out = [s for s in range(1, max_steps + 1) if allowed is not None and s not in allowed]
    return f"steps {', '.join(map(str, out))} left out: {caps.why_not_value(STEPS, out[0])}" if out else ""
