"""`sglang-flags`' arithmetic: from an SGLang launch to one where the wanted step tiers can be pinned
at every batch size the server runs.

SGLang 0.5.23 captures graphs for a tier only at the batch sizes whose slot lists it
(probes/sglang_tiers), so on its default adaptive config no tier but the launch's can be pinned
everywhere. The plan adds the wanted tiers to every slot, keeps each slot's knobs, and says what that
costs and changes:
- the CUDA graphs the extra tiers add (runners per tier × the graph sizes that reach it);
- with a running server's `memory_usage.graph`, that memory scaled by graph count per phase (an
  estimate from the server's own figures, not a measurement; start-up time is not predicted);
- SGLang's own controller may now pick the added tiers in each slot; `freeze` (warmup_batches
  1e9) keeps every slot on its starting tier until a pin moves it.

Pure: works on a `/server_info` dict, a config it is given, and the plugin's published tiers. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from probes.adaptive_policy import DEFAULT_TIERS, KNOB_DEFAULTS, parse_config, write_config
from probes.sglang_tiers import (
    FREEZE_WARMUP, coverage, decode_graph_bs, everywhere, graph_bs_for_step, graph_count, ranges_text, route,
    runners, widened,
)
from tuner.backends.common_info import internal_state
from tuner.backends.sglang.pinnable import parse as parse_pinnable

# memory_usage.graph's phases (internal_state.py:33) and which runner fills each
PHASE_OF_RUNNER = {"draft": "draft_decode", "verify": "target_verify", "extend": "draft_extend"}


class FlagsError(ValueError):
    """The launch cannot be planned; one line saying why and what to pass."""


@dataclass
class Launch:
    """What the plan needs to know of a running (or saved) SGLang launch."""
    adaptive: bool
    config_path: str | None
    launch_steps: int | None
    max_bs: int
    graph_bs: list[int] | None            # None: CUDA graphs off
    slots: dict[int, list[int]] | None    # None: not known here (a config only on the server)
    knobs: dict[int, dict[str, float]] = field(default_factory=dict)
    graph_gb: dict[str, float] | None = None
    source_of_slots: str = ""


@dataclass
class Plan:
    config: dict[str, Any]
    flags: list[str]
    before: dict[int, list[list[int]]]
    after: dict[int, list[list[int]]]
    graphs_before: int
    graphs_after: int
    added_by_tier: dict[int, int]          # tier -> graphs it adds
    slot_changes: list[tuple[int, list[int], list[int]]]   # (threshold, before, after)
    memory_gb: dict[str, float] | None     # phase -> added GB (estimate)
    launch: Launch


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def launch_of(raw: Mapping[str, Any], config: Mapping[int, dict] | None = None) -> Launch:
    """Read a `/server_info` body; `config` is the launch's adaptive config when given by the user
    (a copy of a file that exists only on the server). The plugin's published tiers win: they are
    what SGLang loaded."""
    st = internal_state(dict(raw))
    get = lambda k: st.get(k, raw.get(k))          # noqa: E731
    adaptive = bool(get("speculative_adaptive"))
    path = raw.get("speculative_adaptive_config")
    max_bs = _int(st.get("effective_max_running_requests_per_dp")) or _int(get("max_running_requests"))
    if not max_bs or max_bs < 1:
        raise FlagsError("the server info has no max_running_requests (nor effective_max_running_requests_per_dp)")
    launch_steps = _int(raw.get("speculative_num_steps"))
    pin = parse_pinnable(st)
    if get("disable_cuda_graph"):
        graph_bs = None
    elif pin is not None and pin.graph_bs:
        graph_bs = list(pin.graph_bs)
    elif isinstance(get("cuda_graph_bs_decode"), list):
        graph_bs = sorted(b for b in get("cuda_graph_bs_decode") if isinstance(b, int) and b <= max_bs)
    else:
        cap = _int(get("cuda_graph_max_bs")) or max_bs
        graph_bs = [b for b in decode_graph_bs(min(cap, max_bs), not get("disable_cuda_graph_padding"))]
    mem = st.get("memory_usage")
    graph_gb = ({k: float(v) for k, v in mem["graph"].items() if isinstance(v, (int, float))}
                if isinstance(mem, dict) and isinstance(mem.get("graph"), dict) else None)
    lau = Launch(adaptive, str(path) if path else None, launch_steps, max_bs, graph_bs, None, graph_gb=graph_gb)
    if pin is not None and pin.slots:
        lau.slots = {bs: list(c) for bs, c in pin.slots}
        lau.knobs = {bs: dict(k) for bs, k in pin.slot_knobs.items()}
        lau.launch_steps = pin.launch if pin.launch is not None else launch_steps
        lau.source_of_slots = "the plugin's published tiers"
    elif config is not None:
        _take(lau, config, "--config")
    elif adaptive and not path:
        _take(lau, parse_config({str(k): v for k, v in DEFAULT_TIERS.items()}), "SGLang's default tiers")
    elif not adaptive:
        lau.slots, lau.source_of_slots = {}, "a launch without --speculative-adaptive"
    return lau


def _take(lau: Launch, tiers: Mapping[int, dict], source: str) -> None:
    lau.slots = {bs: list(t["candidate_steps"]) for bs, t in tiers.items()}
    lau.knobs = {bs: {k: t[k] for k in KNOB_DEFAULTS if k in t} for bs, t in tiers.items()}
    lau.source_of_slots = source


def _cover(slots: Mapping[int, list[int]], lau: Launch, launch_steps: int | None) -> dict[int, list[list[int]]]:
    steps = {s for c in slots.values() for s in c} | ({launch_steps} if launch_steps is not None else set())
    return coverage(lambda bs: slots[route(bs, slots, lau.graph_bs)], steps, launch_steps,
                    lau.graph_bs is not None, lau.max_bs)


def _graphs_by_phase(slots: Mapping[int, list[int]], graph_bs: list[int], launch: int | None) -> dict[str, int]:
    out = {p: 0 for p in PHASE_OF_RUNNER.values()}
    steps = {s for c in slots.values() for s in c} | ({launch} if launch is not None else set())
    for s in steps:
        n = len(graph_bs_for_step(s, slots, graph_bs, launch))
        out["target_verify"] += n
        out["draft_extend"] += n
        if runners(s) > 2:
            out["draft_decode"] += n
    return out


def plan(lau: Launch, steps: list[int], config_path: str, freeze: bool = False) -> Plan:
    """The config and flags that let every step in `steps` be pinned at every batch size 1..max_bs."""
    if not steps or any(s < 0 for s in steps):
        raise FlagsError(f"--steps must be whole numbers >= 0, got {steps}")
    if lau.slots is None:
        raise FlagsError(
            f"this launch's adaptive config ({lau.config_path}) is a file on the server, and the server "
            "publishes no tiers (the specdecode plugin 2 and later does): pass a copy with --config FILE")
    wanted = sorted(set(steps))
    launch_steps = lau.launch_steps
    old = {bs: sorted(c) for bs, c in lau.slots.items()}
    if not lau.adaptive or not old:
        # Not adaptive yet: one slot for every batch size, starting on the launch's steps.
        start = launch_steps if launch_steps is not None and launch_steps > 0 else wanted[len(wanted) // 2]
        old, launch_steps = {}, start
        new = {1: sorted(set(wanted) | {start})}
    else:
        new = widened(old, wanted)
    knobs = {bs: dict(lau.knobs.get(bs, {})) for bs in new}
    if freeze:
        for k in knobs.values():
            k["warmup_batches"] = FREEZE_WARMUP
    config = write_config(new, knobs)
    graph_bs = lau.graph_bs or []
    # a launch captures its own tier at every graph size, adaptive or not
    before_n = graph_count(old, graph_bs, launch_steps)
    after_n = graph_count(new, graph_bs, launch_steps)
    old_steps = {x for c in old.values() for x in c} | ({launch_steps} if launch_steps is not None else set())
    added: dict[int, int] = {}
    for s in sorted({x for c in new.values() for x in c}):
        was = len(graph_bs_for_step(s, old, graph_bs, launch_steps)) if s in old_steps else 0
        now = len(graph_bs_for_step(s, new, graph_bs, launch_steps))
        if now > was:
            added[s] = runners(s) * (now - was)
    memory = None
    if lau.graph_gb is not None and old and graph_bs:
        b, a = _graphs_by_phase(old, graph_bs, launch_steps), _graphs_by_phase(new, graph_bs, launch_steps)
        memory = {ph: round(lau.graph_gb.get(ph, 0.0) * (a[ph] - b[ph]) / b[ph], 3)
                  for ph in b if b[ph] > 0 and a[ph] > b[ph] and ph in lau.graph_gb}
    flags = ["--speculative-adaptive", "--speculative-adaptive-config", config_path,
             "--speculative-eagle-topk", "1"]
    if launch_steps is not None:
        flags += ["--speculative-num-steps", str(launch_steps), "--speculative-num-draft-tokens", str(launch_steps + 1)]
    changes = [(bs, old.get(bs, []), c) for bs, c in new.items() if old.get(bs, []) != c]
    return Plan(config, flags, _cover(old, lau, launch_steps) if old else {}, _cover(new, lau, launch_steps),
                before_n, after_n, added, changes, memory, lau)


def explain(p: Plan, wanted: list[int], freeze: bool) -> list[str]:
    """What people read: where each wanted tier can be pinned before and after, the graphs and memory
    it costs, and how SGLang's own policy changes."""
    lau = p.launch
    out = [f"launch: {'adaptive' if lau.adaptive else 'not adaptive'}, {lau.max_bs} requests at most, "
           f"{'CUDA graphs off' if lau.graph_bs is None else f'{len(lau.graph_bs)} decode graph sizes up to {max(lau.graph_bs)}'}"
           + (f"; tiers from {lau.source_of_slots}" if lau.source_of_slots else "")]
    for s in sorted(set(wanted)):
        before = p.before.get(s, [])
        state = ("everywhere" if everywhere(before, lau.max_bs) else ranges_text(before) + " only") if before \
            else "not pinnable"
        out.append(f"  steps {s}: now {state} → every batch size (bs 1-{lau.max_bs})")
    extra = p.graphs_after - p.graphs_before
    per = ", ".join(f"steps {s} +{n}" for s, n in sorted(p.added_by_tier.items()))
    out.append(f"CUDA graphs: {p.graphs_before} → {p.graphs_after} (+{extra}: {per or 'none'}); "
               "each is a tier's runner (target verify, draft extend, and the draft's multi-step runner "
               "from steps 2) at one graph size")
    if p.memory_gb is not None:
        total = sum(p.memory_gb.values())
        parts = ", ".join(f"{ph} +{gb:.2f}" for ph, gb in p.memory_gb.items())
        out.append(f"graph memory: about +{total:.2f} GB per GPU ({parts}), scaled by graph count from this "
                   "server's memory_usage.graph; an estimate, not a measurement. Start-up time: not predicted")
    for bs, was, now in p.slot_changes:
        new = sorted(set(now) - set(was))
        if not was:
            out.append(f"slot bs ≥ {bs}: candidates {now}")
            continue
        if bs > lau.max_bs:
            out.append(f"slot bs ≥ {bs}: candidates {was} → {now} (never reached at {lau.max_bs} requests)")
            continue
        out.append(f"slot bs ≥ {bs}: candidates {was} → {now}: "
                   + ("frozen: SGLang's controller stays on its start tier until a pin moves it"
                      if freeze else f"SGLang's controller may now pick {', '.join(map(str, new))} here "
                      "(it follows acceptance only, never cost)"))
    if not freeze and p.slot_changes:
        out.append("to turn SGLang's own controller off (only your pins move the tier): add --freeze-policy")
    return out
