"""Which step tiers an SGLang 0.5.23 adaptive launch can run, at which batch sizes, with CUDA graphs.

SGLang's adaptive launch (`--speculative-adaptive`) captures a runtime state per candidate step at
startup. The launch's own step keeps the graphs of every captured batch size; every other tier gets
graphs only at the captured batch sizes whose slot lists it (`AdaptiveController.init_states` →
`cuda_graph_bs_for_step`, adaptive_runtime_state.py:103-120, adaptive_spec_params.py:328-341;
the launch state is registered first, eagle_worker_v2.py:1390-1413). A batch is routed by padding
its size up to a captured graph size, then taking the largest slot threshold at or below it
(`_route`, adaptive_spec_params.py:342-361). So a pinned tier can run from its graphs exactly at the
batch sizes whose route lists it; elsewhere SGLang's own policy runs (the plugin's pin yields).
All of this is from the 0.5.23 source, not run.

Two callers, one arithmetic: the plugin computes coverage inside SGLang with SGLang's own `_route`
(passed in as `candidates_at`), and `sglang-flags` predicts it for a config that is not launched yet
with `route()` below (a test checks the two agree on SGLang's real classes).

Standard library only, pure: no I/O, no SGLang, no torch.
"""

from __future__ import annotations

import bisect
from typing import Callable, Iterable, Mapping, Sequence

FREEZE_WARMUP = 1_000_000_000
"""`warmup_batches` so large that SGLang's controller never moves a slot's tier: the pin decides."""

Ranges = list[list[int]]          # inclusive [lo, hi] batch-size ranges, ascending


def decode_graph_bs(max_bs: int, padding: bool = True) -> list[int]:
    """The decode CUDA-graph batch sizes SGLang captures for a speculative launch whose largest is
    `max_bs` (`generate_decode_cuda_graph_batch_sizes`, spec branch, arg_groups/cuda_graph_hook.py:
    500-531; with --disable-cuda-graph-padding every size up to max_bs)."""
    if max_bs < 1:
        return []
    if not padding:
        return list(range(1, max_bs + 1))
    sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
             + list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16)))
    sizes = [b for b in sizes if b <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def route(bs: int, slots: Mapping[int, Sequence[int]], graph_bs: Sequence[int] | None) -> int:
    """The slot threshold a batch of `bs` requests uses: pad to a captured graph size (a size
    past the largest stays as it is), then the largest threshold at or below it (SGLang's `_route`)."""
    padded = bs
    if graph_bs:
        sizes = sorted(graph_bs)
        i = bisect.bisect_left(sizes, bs)
        padded = sizes[i] if i < len(sizes) else bs
    keys = sorted(slots)
    i = bisect.bisect_right(keys, padded) - 1
    return keys[max(0, i)]


def ranges_where(holds: Callable[[int], bool], max_bs: int) -> Ranges:
    """The batch sizes 1..max_bs where `holds(bs)`, as inclusive ranges."""
    out: Ranges = []
    for bs in range(1, max_bs + 1):
        if not holds(bs):
            continue
        if out and out[-1][1] == bs - 1:
            out[-1][1] = bs
        else:
            out.append([bs, bs])
    return out


def coverage(candidates_at: Callable[[int], Iterable[int]], captured: Iterable[int],
             launch: int | None, graphs: bool, max_bs: int) -> dict[int, Ranges]:
    """Batch sizes (1..max_bs) where each captured tier runs from its own graphs when pinned.

    candidates_at(bs): the candidate steps of the slot that batch size routes to. The launch's tier
    and, with CUDA graphs off, every tier run at any batch size."""
    out: dict[int, Ranges] = {}
    for step in sorted(set(captured)):
        if step == launch or not graphs:
            out[step] = [[1, max_bs]] if max_bs >= 1 else []
        else:
            out[step] = ranges_where(lambda bs, s=step: s in candidates_at(bs), max_bs)
    return out


def everywhere(ranges: Ranges, max_bs: int) -> bool:
    return ranges == [[1, max_bs]]


def ranges_text(ranges: Ranges) -> str:
    """"bs 1-4, 8-31" (or "no batch size")."""
    if not ranges:
        return "no batch size"
    return "bs " + ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def graph_bs_for_step(step: int, slots: Mapping[int, Sequence[int]], graph_bs: Sequence[int],
                      launch: int | None) -> list[int]:
    """The captured batch sizes that get graphs for `step` (`cuda_graph_bs_for_step`; the launch's
    tier keeps all of them)."""
    if step == launch:
        return list(graph_bs)
    return [v for v in graph_bs if step in slots[route(v, slots, None)]]


def runners(step: int) -> int:
    """CUDA-graph runners one tier captures per batch size: the target verify and the draft extend,
    plus the draft's multi-step runner when steps > 1 (eagle_worker_v2.py:507; the draft-extend
    runner assumes a supported attention backend, :567-629)."""
    return 2 + (1 if step > 1 else 0)


def graph_count(slots: Mapping[int, Sequence[int]], graph_bs: Sequence[int], launch: int | None) -> int:
    """CUDA graphs an adaptive launch captures for its speculative runners, over every tier."""
    steps = sorted({s for c in slots.values() for s in c} | ({launch} if launch is not None else set()))
    return sum(runners(s) * len(graph_bs_for_step(s, slots, graph_bs, launch)) for s in steps)


def widened(slots: Mapping[int, Sequence[int]], steps: Iterable[int]) -> dict[int, list[int]]:
    """Every slot's candidates with `steps` added (so each can be pinned at every batch size)."""
    add = set(steps)
    return {bs: sorted(set(c) | add) for bs, c in sorted(slots.items())}
