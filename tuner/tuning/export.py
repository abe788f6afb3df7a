"""Recommendations written the way an SGLang operator uses them: launch flags, and for chains a
`--speculative-adaptive-config` JSON that pins the tuned step per batch-size tier.

SGLang's adaptive config maps batch-size thresholds ("1", "8", ...) to `candidate_steps`; with one
candidate per tier the EMA policy has nothing to move to, so the file becomes a per-batch-size table
of the tuned steps. SGLang 0.5.23 has no draft-placement flag: a non-sharded recommendation is
exported with the reference engine's flag and a note. Pure formatting; writes no files.
"""

from __future__ import annotations

import json
from typing import Mapping

from probes.names import SHARDED
from tuner.core import setting as vocab
from tuner.tuning.settings import Setting


def sglang_flags(s: Setting) -> list[str]:
    """Launch flags for one setting (empty when speculation is off: launch without them)."""
    if s.steps == 0:
        return []
    args = s.as_server_args()
    out = ["--speculative-algorithm", "EAGLE3"]
    for k in vocab.knobs():
        if k.launch_flag and k.arg in args:
            out += [k.launch_flag, str(args[k.arg])]
    return out


def placement_note(s: Setting) -> str | None:
    if s.placement == SHARDED:
        return None
    return (f"draft placement {s.placement!r} has no SGLang 0.5.23 flag; on the reference engine use "
            f"--speculative-draft-placement {s.placement}")


def adaptive_config(per_bs: Mapping[int, Setting]) -> dict:
    """SGLang `--speculative-adaptive-config` JSON: one tier per measured batch size.

    Only chains (topk=1) can be expressed (SGLang's adaptive mode requires topk=1); a tier whose
    best setting is a tree raises ValueError. The smallest threshold is lowered to 1 so every batch
    size routes somewhere.
    """
    if not per_bs:
        raise ValueError("no recommendation to export")
    from probes.adaptive_policy import write_config

    slots: dict[int, list[int]] = {}
    for i, (bs, s) in enumerate(sorted(per_bs.items())):
        if s.topk != 1:
            raise ValueError(f"bs={bs}: the best setting is a tree (topk={s.topk}); SGLang's adaptive "
                             "config can only pin chain steps")
        slots[1 if i == 0 else bs] = [s.steps]
    return write_config(slots)


def adaptive_flags(per_bs: Mapping[int, Setting], config_path: str) -> list[str]:
    """Launch flags that load the adaptive config. SGLang requires --speculative-num-steps to be a
    candidate; it starts at the smallest batch size's step."""
    first = per_bs[min(per_bs)]
    start = first.steps if first.steps > 0 else max((s.steps for s in per_bs.values()), default=0)
    if start == 0:
        return []  # speculation off at every batch size
    return ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(start),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(start + 1),
            "--speculative-adaptive", "--speculative-adaptive-config", config_path]


def adaptive_config_text(per_bs: Mapping[int, Setting]) -> str:
    return json.dumps(adaptive_config(per_bs), indent=2, sort_keys=False) + "\n"
