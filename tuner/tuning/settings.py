"""Speculative-decoding settings and the space the tuner searches.

A `Setting` is one point of (steps, topk, num_draft_tokens, placement) with the engine's
semantics: steps=0 is SGLang's tier 0 (a one-token verify, the draft kept warm), topk=1 forces
num_draft_tokens = steps+1, and a tree must fit its candidate pool (N-1 <= k + (s-1)*k^2). This module only describes settings; it never
talks to a server and never measures anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from probes.names import DRAFT_TOKENS, PLACEMENT, PLACEMENTS, SHARDED, STEPS, TOPK, tree_pool


@dataclass(frozen=True, order=True)
class Setting:
    steps: int
    topk: int = 1
    num_draft_tokens: int = 0  # 0 = derived (steps+1 for a chain, 1 at tier 0)
    placement: str = SHARDED

    def __post_init__(self) -> None:
        if self.steps == 0:
            # Tier 0 drafts nothing (only the draft-extend runs), so topk and N do not exist for
            # it: one canonical point, whatever placement the server reports.
            object.__setattr__(self, "topk", 1)
            object.__setattr__(self, "num_draft_tokens", 1)
            object.__setattr__(self, "placement", SHARDED)
        elif self.topk == 1 and self.num_draft_tokens == 0:
            object.__setattr__(self, "num_draft_tokens", self.steps + 1)
        problem = setting_problem(self)
        if problem:
            raise ValueError(problem)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def speculative(self) -> bool:
        return self.steps > 0

    def label(self) -> str:
        if self.steps == 0:
            return f"off/{self.placement}"
        return f"s{self.steps} k{self.topk} N{self.num_draft_tokens} {self.placement}"

    def as_server_args(self) -> dict[str, object]:
        """The /set_internal_state body for this setting (the engine's key names)."""
        args: dict[str, object] = {STEPS: self.steps}
        if self.steps > 0:
            args[TOPK] = self.topk
            args[DRAFT_TOKENS] = self.num_draft_tokens
            args[PLACEMENT] = self.placement
        return args

    def to_json(self) -> dict[str, object]:
        return {"steps": self.steps, "topk": self.topk,
                "num_draft_tokens": self.num_draft_tokens, "placement": self.placement}

    @classmethod
    def from_json(cls, d: dict) -> "Setting":
        return cls(int(d["steps"]), int(d.get("topk", 1)), int(d.get("num_draft_tokens", 0)),
                   str(d.get("placement", SHARDED)))


def setting_problem(s: Setting) -> str | None:
    """Why this setting is invalid, or None."""
    if not isinstance(s.placement, str) or s.placement not in PLACEMENTS:
        return f"unknown placement {s.placement!r} (expected one of {', '.join(PLACEMENTS)})"
    if s.steps < 0 or s.topk < 1 or s.num_draft_tokens < 1:
        return f"steps must be >= 0, topk and num_draft_tokens >= 1 (got {s})"
    if s.steps == 0:
        return None
    if s.num_draft_tokens < 2:
        return "speculation needs num_draft_tokens >= 2 (the root plus at least one draft)"
    if s.topk == 1 and s.num_draft_tokens != s.steps + 1:
        return "topk=1 requires num_draft_tokens = steps+1"
    pool = tree_pool(s.steps, s.topk)
    if s.num_draft_tokens - 1 > pool:
        return (f"num_draft_tokens={s.num_draft_tokens} exceeds the candidate pool "
                f"{pool}+1 of steps={s.steps}, topk={s.topk}")
    return None


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
                                           x.num_draft_tokens))
