"""The operator side's one vocabulary for a speculative setting: the knob table and `Setting`.

Every place that names a knob (the TUI's keys, help, palette and knobs panel, the header and event
log, the recording's active config, the report's columns, the tuner's search space) reads the
`KNOBS` table below, so adding a knob is one row here plus its names in `probes.names` (a backend's
settable set, SGLang's relaunch flags and the plugin's records follow from them).
`Setting` is one point of the table's values with the engine's semantics.

Standard library and `probes.names` only (an import-linter contract checks it): no I/O, no server,
no measuring, no widgets.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

from probes.names import (ACCEPT_THRESHOLD_SINGLE, DRAFT_TOKENS, PINNED_STEPS, PLACEMENT, PLACEMENTS,
                          R_ACCEPT_THRESHOLD_SINGLE, R_DRAFT_TOKENS, R_PLACEMENT, R_STEPS, R_TOPK, SHARDED, STEPS,
                          TOPK, tree_pool)


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One knob, in every spelling the operator side needs.

    A knob is either stepped (a number changed by `step` within `lo`..`hi`, two keys) or cycled
    (`values`, one key that moves to the next value).
    """

    arg: str
    """The server-arg name (/set_internal_state, internal_states[0]): probes.names."""
    key: str
    """The phase record's key, also the key in a setting's JSON (`Setting` field when core)."""
    name: str
    """One identifier: the TUI action's argument and `name=value` in the report and `record`."""
    word: str
    """The knob in running text on screen: "steps 3 · draft 4", "draft 4→5"."""
    label: str
    """The knobs panel's row label."""
    letter: str
    """Prefix in the compact label ("s3 k1 N4 sharded"); "" shows the value alone."""
    help: str
    """What its keys do, in words (the help screen)."""
    keys: tuple[str, ...]
    """Binding keys: (more, less) for a stepped knob, (next,) for a cycled one (Textual key names)."""
    shown: tuple[str, ...]
    """How each key is displayed."""
    palette: tuple[str, ...]
    """Command palette titles, in the order of `keys`."""
    lo: float | None = None
    hi: float | None = None
    step: float = 1
    values: tuple[str, ...] = ()
    """A cycled knob's values, in the order its key walks them."""
    footer_less: bool = True
    """Whether the footer shows the "less" key too (it is always bound and in the help)."""
    footer: bool = True
    """Whether the footer shows its keys at all (a narrow terminal keeps room for the common keys;
    the keys stay bound and in the help, the palette and the knobs panel)."""
    aliases: tuple[str, ...] = ()
    """Other server names a server may report the same knob under."""
    tune: tuple[Any, ...] = ()
    """Values the tuner sweeps when the server can change it live (core knobs have their own rule)."""
    sglang_flag: bool = True
    """SGLang has a launch flag for it (`--` + arg with dashes); placement is ours alone."""
    sglang_live: bool = False
    """SGLang 0.5.23 itself takes it live through /set_internal_state (its `_update_handlers`);
    steps is live only through the plugin's pin, which the SGLang backend judges."""

    @property
    def cycled(self) -> bool:
        return bool(self.values)

    @property
    def launch_flag(self) -> str:
        """SGLang's launch flag (its ServerArgs field as argparse spells it), "" when it has none."""
        return "--" + self.arg.replace("_", "-") if self.sglang_flag else ""

    def moves(self) -> tuple[tuple[str, str, int, str], ...]:
        """(key, shown, delta, footer label) per binding: +1/-1 for a stepped knob, +1 (next) cycled."""
        if self.cycled:
            return ((self.keys[0], self.shown[0], 1, self.word),)
        return ((self.keys[0], self.shown[0], 1, f"{self.word}+"), (self.keys[1], self.shown[1], -1, f"{self.word}-"))

    def bumped(self, current: Any, delta: int, allowed: Sequence[Any] | None = None) -> Any:
        """The value one key press away from `current` (None when the current value is unknown).
        `allowed`: the only values the server takes live (the next one that way, or `current` at the
        end)."""
        if allowed is not None and not self.cycled:
            if isinstance(current, bool) or not isinstance(current, (int, float)):
                return None
            ahead = sorted(v for v in allowed if (v > current if delta > 0 else v < current))
            if not ahead:
                return current
            return ahead[0] if delta > 0 else ahead[-1]
        if self.cycled:
            vals = self.values
            return vals[(vals.index(current) + delta) % len(vals)] if current in vals else vals[0]
        if isinstance(current, bool) or not isinstance(current, (int, float)):
            return None
        v = current + delta * self.step
        v = round(v, 9) if isinstance(v, float) else v      # 0.1 steps must not print as 0.30000000000000004
        if self.lo is not None:
            v = max(self.lo, v)
        if self.hi is not None:
            v = min(self.hi, v)
        return v


KNOBS: tuple[Knob, ...] = (
    Knob(arg=STEPS, key=R_STEPS, name="steps", word="steps", label="steps", letter="s",
         help="one more / one fewer draft step (speculative_num_steps; 0 = tier 0, draft kept warm)",
         keys=("plus,equals_sign", "minus"), shown=("+", "-"),
         palette=("More draft steps", "Fewer draft steps"), lo=0, aliases=(PINNED_STEPS,)),
    Knob(arg=TOPK, key=R_TOPK, name="topk", word="topk", label="topk", letter="k",
         help="wider / narrower draft tree (speculative_eagle_topk)",
         keys=("t", "T"), shown=("t", "T"),
         palette=("Wider draft tree", "Narrower draft tree"), lo=1, footer_less=False),
    Knob(arg=DRAFT_TOKENS, key=R_DRAFT_TOKENS, name="draft_tokens", word="draft", label="draft tokens",
         letter="N",
         help="more / fewer tokens verified per step (speculative_num_draft_tokens)",
         keys=("d", "D"), shown=("d", "D"),
         palette=("More draft tokens", "Fewer draft tokens"), lo=1, footer_less=False),
    Knob(arg=PLACEMENT, key=R_PLACEMENT, name="placement", word="placement", label="placement", letter="",
         help="move the draft: sharded (target's TP group) → replicated (every rank) → rank0",
         keys=("p",), shown=("p",), palette=("Next draft placement",), values=PLACEMENTS, sglang_flag=False),
    Knob(arg=ACCEPT_THRESHOLD_SINGLE, key=R_ACCEPT_THRESHOLD_SINGLE, name="accept_single", word="accept",
         label="accept thr.", letter="a",
         help="raise / lower the single-token acceptance threshold (speculative_accept_threshold_single)",
         keys=("j", "J"), shown=("j", "J"), palette=("Raise the accept threshold", "Lower the accept threshold"),
         lo=0.0, hi=1.0, step=0.1, tune=(0.5, 1.0), footer=False, sglang_live=True),
)
"""Every knob, in display order. Read it at call time (never copy it at import): a test adds a row."""

TIER0_WORDS = "tier 0 (draft kept warm)"


def knobs() -> tuple[Knob, ...]:
    return KNOBS


def args() -> tuple[str, ...]:
    """The knobs' server-arg names, in display order."""
    return tuple(k.arg for k in KNOBS)


def knob(name_or_arg: str) -> Knob | None:
    """The row for an action name, a server-arg name, a record key or an alias; None if unknown."""
    return next((k for k in KNOBS if name_or_arg in (k.name, k.arg, k.key, *k.aliases)), None)


def word(arg: str) -> str:
    """The on-screen word for a server-arg name (an unknown one without its `speculative_` prefix)."""
    k = knob(arg)
    return k.word if k is not None else arg.removeprefix("speculative_")


def value_of(d: Mapping[str, Any], k: Knob) -> Any:
    """A knob's value in a dict keyed by server-arg names, aliases or record keys (None if absent)."""
    return next((d[n] for n in (k.arg, *k.aliases, k.key) if d.get(n) is not None), None)


def by_arg(d: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs of a dict in either naming, under their server-arg names (absent ones left out)."""
    return {k.arg: v for k in KNOBS if (v := value_of(d, k)) is not None}


def from_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs a phase record ran with, under their server-arg names (None where not reported)."""
    return {k.arg: record.get(k.key) for k in KNOBS}


def key_of(d: Mapping[str, Any]) -> tuple:
    """A hashable key for a setting's JSON (record keys), in table order; tier 0 is one point."""
    if d.get(R_STEPS) == 0:
        d = Setting(0).to_json()
    return tuple(d.get(k.key) for k in KNOBS)


def from_key(key: tuple) -> dict[str, Any]:
    """The setting JSON of a `key_of` key (a knob the setting does not have left out, as in to_json)."""
    return {k.key: v for k, v in zip(KNOBS, key) if v is not None}


# -- the ways a setting is written ------------------------------------------------------------

def _off(d: Mapping[str, Any]) -> bool:
    steps = knob(STEPS)
    return steps is not None and value_of(d, steps) == 0


def compact(d: Mapping[str, Any]) -> str:
    """`s3 k1 N4 sharded`; `off` at tier 0 (the tune screen's rows and the tuner's status)."""
    if not d or _off(d):
        return "off"
    return " ".join(f"{k.letter}{v}" for k in KNOBS if (v := value_of(d, k)) is not None)


def words(d: Mapping[str, Any], sep: str = " · ") -> str:
    """`steps 3 · topk 1 · draft 4 · sharded`; the tier-0 sentence at steps 0; "?" when empty."""
    if _off(d):
        return TIER0_WORDS
    parts = [str(v) if k.cycled else f"{k.word} {v}" for k in KNOBS if (v := value_of(d, k)) is not None]
    return sep.join(parts) or "?"


def pairs(d: Mapping[str, Any]) -> str:
    """`steps=3 topk=1 draft_tokens=4 placement=sharded` (the report and `record`); "" when empty."""
    return " ".join(f"{k.name}={v}" for k in KNOBS if (v := value_of(d, k)) is not None)


def change_words(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """`steps 3→5, placement sharded→rank0` for the knobs that differ (table order first)."""
    order = [k.arg for k in KNOBS]
    keys = sorted(new, key=lambda a: order.index(a) if a in order else len(order))
    diffs = [f"{word(a)} {old.get(a, '?')}→{new[a]}" for a in keys if old.get(a) != new[a]]
    return ", ".join(diffs) or "setting"


# -- one point of the table --------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Setting:
    """One setting with the engine's semantics.

    steps=0 is SGLang's tier 0 (a one-token verify, the draft kept warm), topk=1 forces
    num_draft_tokens = steps+1, and a tree must fit its candidate pool (N-1 <= k + (s-1)*k^2).
    `extra` holds the values of table knobs beyond these four, as sorted (record key, value) pairs.
    """

    steps: int
    topk: int = 1
    num_draft_tokens: int = 0  # 0 = derived (steps+1 for a chain, 1 at tier 0)
    placement: str = SHARDED
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.steps == 0:
            # Tier 0 drafts nothing (only the draft-extend runs), so no speculative knob exists for
            # it: one canonical point, whatever the server reports.
            object.__setattr__(self, "topk", 1)
            object.__setattr__(self, R_DRAFT_TOKENS, 1)
            object.__setattr__(self, "placement", SHARDED)
            object.__setattr__(self, "extra", ())
        elif self.topk == 1 and self.num_draft_tokens == 0:
            object.__setattr__(self, R_DRAFT_TOKENS, self.steps + 1)
        object.__setattr__(self, "extra", tuple(sorted(dict(self.extra).items())))
        problem = setting_problem(self)
        if problem:
            raise ValueError(problem)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def speculative(self) -> bool:
        return self.steps > 0

    def get(self, k: Knob) -> Any:
        return getattr(self, k.key) if k.key in CORE else dict(self.extra).get(k.key)

    def label(self) -> str:
        """The compact label (`s3 k1 N4 sharded`, `off`)."""
        return compact(self.to_json())

    def as_server_args(self) -> dict[str, object]:
        """The /set_internal_state body for this setting (server-arg names)."""
        if self.steps == 0:
            return {STEPS: 0}
        return {k.arg: v for k in KNOBS if (v := self.get(k)) is not None}

    def to_json(self) -> dict[str, object]:
        return {k.key: v for k in KNOBS if (v := self.get(k)) is not None or k.key in CORE}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Setting":
        """From a setting's JSON (record keys); ValueError/TypeError/KeyError when it is not one."""
        extra = tuple((k.key, d[k.key]) for k in KNOBS if k.key not in CORE and d.get(k.key) is not None)
        return cls(int(d["steps"]), int(d.get("topk", 1)), int(d.get(R_DRAFT_TOKENS, 0)),
                   str(d.get("placement", SHARDED)), extra)

    @classmethod
    def from_args(cls, active: Mapping[str, Any]) -> "Setting | None":
        """From an active-config dict (server-arg names or aliases); None when incomplete or invalid."""
        vals = {k.key: value_of(active, k) for k in KNOBS}
        if not isinstance(vals.get(R_STEPS), int) or isinstance(vals.get(R_STEPS), bool):
            return None
        try:
            return cls.from_json({k: v for k, v in vals.items() if v is not None})
        except (TypeError, ValueError):
            return None


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
    for key, v in s.extra:
        k = knob(key)
        if k is None:
            return f"unknown knob {key!r}"
        if k.cycled:
            if v not in k.values:
                return f"unknown {k.name} {v!r} (expected one of {', '.join(k.values)})"
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{k.name} must be a number (got {v!r})"      # a record is data: never a TypeError
        elif (k.lo is not None and v < k.lo) or (k.hi is not None and v > k.hi):
            return f"{k.name}={v} is outside {k.lo}..{k.hi}"
    return None


CORE: frozenset[str] = frozenset(f.name for f in fields(Setting)) - {"extra"}
"""The record keys that are Setting's own fields; every other table knob lives in `extra`."""


def extra_knobs() -> tuple[Knob, ...]:
    """The table's knobs beyond Setting's four core fields."""
    return tuple(k for k in KNOBS if k.key not in CORE)


def with_extras(base: Iterable[Setting], choices: Mapping[str, Iterable[Any]]) -> list[Setting]:
    """Each speculative setting of `base` once per combination of the extra knobs' `choices`
    (record key -> values); tier 0 stays one point."""
    out = list(base)
    for key, vals in choices.items():
        vals = list(vals)
        if not vals:
            continue
        out = [s if s.steps == 0 else Setting(s.steps, s.topk, s.num_draft_tokens, s.placement,
                                              (*s.extra, (key, v)))
               for s in out for v in (vals if s.steps else [None])]
    return list(dict.fromkeys(out))
