"""Rewriting an SGLang 0.5.23 launch command for a managed relaunch: pure functions over argv lists.

SGLang cannot change topk, num_draft_tokens, steps (without our plugin), the all-reduce backend or
the draft's parallel layout while it runs, so `specdecode-tune launch` relaunches the server with
a rewritten command. Everything here works on the argv *list* the operator gave (never a shell
string) and returns new lists; the command is printed with shlex quoting only for people to read.

SGLang's flags are `--` + the field name with `_` → `-`; booleans are store_true; a few have
aliases (reference §2). `--flag value` and `--flag=value` are both understood. The knobs' flags come
from the knob table (`Knob.launch_flag`, read at call time), so a new row with a launch flag is
relaunchable here with no entry of its own; only the non-knob keys are listed below.
Must not start processes, touch the network, or import torch / textual.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from probes.names import DRAFT_TOKENS, PLACEMENT, SHARDED, STEPS, TOPK, tree_fits, tree_pool
from tuner.core import setting as vocab

ATTN_DP = "attn_dp_size"
PCIE_IPC_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"

# server arg -> every spelling SGLang 0.5.23 accepts for it, beyond the knobs' (`knob_flags`)
ALIASES: dict[str, tuple[str, ...]] = {
    ATTN_DP: ("--attn-dp-size", "--attention-data-parallel-size"),
    "tp_size": ("--tp-size", "--tensor-parallel-size"),
    "host": ("--host",),
    "port": ("--port",),
    "api_key": ("--api-key",),
    "admin_api_key": ("--admin-api-key",),
    "speculative_adaptive": ("--speculative-adaptive",),
    "speculative_adaptive_config": ("--speculative-adaptive-config",),
    "speculative_algorithm": ("--speculative-algorithm",),
    "enable_metrics": ("--enable-metrics",),
}
BOOLEAN = {"speculative_adaptive", "enable_metrics"}
# Keys `launch` can change by relaunching beyond the knobs with a launch flag: placement (only back
# to "sharded": it drops attention-DP), attention-DP and the PCIe all-reduce switch.
OTHER_RELAUNCH_KEYS = (PLACEMENT, ATTN_DP, PCIE_IPC_ENV)
SPEC_KEYS = (STEPS, TOPK, DRAFT_TOKENS)
"""Given to SGLang together, with the tree's rules (apply_settings)."""
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 30000
SECRET_FLAGS = {"--api-key", "--admin-api-key", "--watermark-config"}


def knob_flags() -> dict[str, str]:
    """Server arg -> SGLang launch flag, for every knob row that has one (table order)."""
    return {k.arg: k.launch_flag for k in vocab.knobs() if k.launch_flag}


def relaunch_keys() -> tuple[str, ...]:
    """Every key `apply_settings` takes: the knobs with a launch flag, then the others."""
    return (*knob_flags(), *OTHER_RELAUNCH_KEYS)


def _spellings(key: str) -> tuple[str, ...]:
    flag = knob_flags().get(key)
    return ALIASES.get(key) or ((flag,) if flag else ("--" + key.replace("_", "-"),))


class ArgsError(ValueError):
    """A setting that cannot be turned into a valid SGLang launch (one line, for people)."""


@dataclass(frozen=True)
class Launch:
    """One way to start the server: the argv list and the environment changes over ours."""
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def display(self) -> str:
        """The exact command, shell-quoted, secrets hidden: for the operator to read or copy."""
        shown: list[str] = []
        hide = False
        for a in self.argv:
            if hide:
                shown.append("<redacted>")
                hide = False
                continue
            flag, eq, _ = a.partition("=")
            if flag in SECRET_FLAGS:
                if eq:
                    shown.append(f"{flag}=<redacted>")
                    continue
                hide = True
            shown.append(a)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        words = " ".join(a if a.endswith("<redacted>") else shlex.quote(a) for a in shown)
        return (env + " " if env else "") + words


def check_command(argv: list[str]) -> None:
    """Refuse what `launch` cannot own: an empty command or a shell string in one word."""
    if not argv:
        raise ArgsError("no server command: use `specdecode-tune launch -- python -m sglang.launch_server ARGS…`")
    if len(argv) == 1 and " " in argv[0]:
        raise ArgsError("give the server command as separate words after `--`, not one quoted string")


def _find(argv: list[str], key: str) -> list[tuple[int, int]]:
    """(start, length) of every occurrence of `key`'s flags; length 1 for --f=v / booleans."""
    spellings = _spellings(key)
    out = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        flag, eq, _ = a.partition("=")
        if flag in spellings:
            if eq or key in BOOLEAN:
                out.append((i, 1))
            else:
                out.append((i, 2 if i + 1 < len(argv) else 1))
            i += out[-1][1]
            continue
        i += 1
    return out


def get_arg(argv: list[str], key: str) -> str | bool | None:
    """The value given for `key` (the last one wins, as argparse); True for a present boolean."""
    found = _find(argv, key)
    if not found:
        return None
    i, n = found[-1]
    if key in BOOLEAN:
        return True
    flag, eq, value = argv[i].partition("=")
    if eq:
        return value
    return argv[i + 1] if n == 2 else None


def set_arg(argv: list[str], key: str, value: Any) -> list[str]:
    """A new argv with every spelling of `key` removed and `--key value` appended (None removes;
    for booleans True adds the bare flag and False removes it)."""
    drop: set[int] = set()
    for i, n in _find(argv, key):
        drop.update(range(i, i + n))
    out = [a for j, a in enumerate(argv) if j not in drop]
    if value is None or value is False:
        return out
    flag = _spellings(key)[0]
    return out + ([flag] if key in BOOLEAN else [flag, str(value)])


def _int(key: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ArgsError(f"{key} must be a whole number, got {value!r}")
    try:
        n = int(value) if not isinstance(value, float) or value.is_integer() else None
    except ValueError:
        n = None
    if n is None or n < lo:
        raise ArgsError(f"{key} must be a whole number >= {lo}, got {value!r}")
    return n


def _knob_value(key: str, value: Any) -> Any:
    """`value` when the knob's row allows it (its values, or a number within its bounds)."""
    k = vocab.knob(key)
    assert k is not None
    if k.cycled:
        if value not in k.values:
            raise ArgsError(f"{key} must be one of {', '.join(k.values)}, got {value!r}")
        return value
    if isinstance(value, str):
        try:
            value = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise ArgsError(f"{key} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ArgsError(f"{key} must be a number, got {value!r}")
    if (k.lo is not None and value < k.lo) or (k.hi is not None and value > k.hi):
        raise ArgsError(f"{key} must be within {k.lo}..{k.hi}, got {value!r}")
    return value


def server_url(argv: list[str]) -> str:
    """Where the launched server will listen (SGLang's defaults when not given)."""
    host = str(get_arg(argv, "host") or DEFAULT_HOST)
    port = _int("port", get_arg(argv, "port") or DEFAULT_PORT, 1)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"              # bound everywhere: loopback reaches it
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def adaptive_candidates(argv: list[str], read_file=Path.read_text) -> list[int] | None:
    """The steps an adaptive launch captured graphs for, when its config file is readable here."""
    if not get_arg(argv, "speculative_adaptive"):
        return None
    path = get_arg(argv, "speculative_adaptive_config")
    if path is None:
        return [0, 1, 3, 5, 7]           # SGLang's DEFAULT_ADAPTIVE_CONFIG, all slots together
    try:
        cfg = json.loads(read_file(Path(str(path))))
    except (OSError, ValueError):
        return None
    steps: set[int] = set()
    for k, entry in cfg.items():
        if k.isdigit() and isinstance(entry, dict):
            steps.update(int(s) for s in entry.get("candidate_steps", []))
    return sorted(steps)


def apply_settings(launch: Launch, changes: Mapping[str, Any],
                   read_file=Path.read_text) -> Launch:
    """The launch with `changes` applied, keeping SGLang's rules; ArgsError says what is wrong.

    Rules (reference §2, §3; design "Configuration semantics"): steps, topk and draft tokens are
    given together (SGLang asserts otherwise); topk 1 means draft tokens = steps + 1, and an
    explicit different value is refused; an adaptive launch must start on a captured step.
    """
    argv = list(launch.argv)
    env = dict(launch.env)
    known = relaunch_keys()
    unknown = [k for k in changes if k not in known]
    if unknown:
        raise ArgsError(f"cannot relaunch SGLang with {', '.join(unknown)}: "
                        f"known settings are {', '.join(known)}")
    if PCIE_IPC_ENV in changes:
        v = changes[PCIE_IPC_ENV]
        if v in (None, False, 0, "0", ""):
            env[PCIE_IPC_ENV] = "0"
        elif v in (True, 1, "1"):
            env[PCIE_IPC_ENV] = "1"
        else:
            raise ArgsError(f"{PCIE_IPC_ENV} must be 0 or 1, got {v!r}")
    if PLACEMENT in changes:
        p = changes[PLACEMENT]
        if p != SHARDED:
            raise ArgsError(
                f"SGLang 0.5.23 has no draft placement '{p}': its EAGLE-3 draft runs on the target's "
                "TP group ('sharded'), or on the attention-TP group with attention-DP "
                f"(set {ATTN_DP} instead, MLA/MoE targets only)")
        argv = set_arg(argv, ATTN_DP, None)
    if ATTN_DP in changes:
        n = _int(ATTN_DP, changes[ATTN_DP], 1)
        tp = get_arg(argv, "tp_size")
        if tp is not None and _int("tp_size", tp, 1) % n:
            raise ArgsError(f"{ATTN_DP}={n} must divide tp_size={tp}")
        argv = set_arg(argv, ATTN_DP, None if n == 1 else n)

    for key in knob_flags():
        if key in changes and key not in SPEC_KEYS:
            # A knob with no rule of its own: its flag with the value, checked against its row.
            argv = set_arg(argv, key, _knob_value(key, changes[key]))

    spec = {k: changes[k] for k in SPEC_KEYS if k in changes}
    if spec:
        adaptive = bool(get_arg(argv, "speculative_adaptive"))
        raw_steps = spec.get(STEPS, get_arg(argv, STEPS))
        if raw_steps is None:
            raise ArgsError(f"set {STEPS} too: SGLang needs steps, topk and draft tokens together")
        steps = _int(STEPS, raw_steps, 0 if adaptive else 1)
        raw_topk = spec.get(TOPK, get_arg(argv, TOPK))
        topk = 1 if raw_topk is None else _int(TOPK, raw_topk, 1)
        if DRAFT_TOKENS in spec:
            ndt_given = spec[DRAFT_TOKENS]
        elif STEPS in spec or TOPK in spec:
            ndt_given = None                 # derived below, or the launch's own for a tree
        else:
            ndt_given = get_arg(argv, DRAFT_TOKENS)
        if topk == 1:
            ndt = steps + 1
            if ndt_given is not None and _int(DRAFT_TOKENS, ndt_given, 1) != ndt:
                raise ArgsError(f"with topk 1 the draft tokens are steps + 1 = {ndt}, not {ndt_given}")
        else:
            if ndt_given is None and TOPK not in spec:
                ndt_given = get_arg(argv, DRAFT_TOKENS)     # a tree launch changing only steps
            if ndt_given is None:
                raise ArgsError(f"with topk {topk} give {DRAFT_TOKENS} too (the tree size)")
            ndt = _int(DRAFT_TOKENS, ndt_given, 2)
            if not tree_fits(steps, topk, ndt):
                # The one rule (probes.names): the candidate pool, not topk x steps, bounds the tree.
                raise ArgsError(f"{DRAFT_TOKENS}={ndt} exceeds the tree: at most topk + (steps - 1) x topk^2 + 1 = "
                                f"{tree_pool(steps, topk) + 1}")
        cands = adaptive_candidates(argv, read_file)
        if adaptive:
            if topk != 1:
                raise ArgsError("SGLang's adaptive steps need topk 1: drop --speculative-adaptive "
                                "to relaunch with a larger topk")
            if cands is not None and steps not in cands:
                raise ArgsError(f"this adaptive launch captures steps {cands}; steps {steps} is not "
                                "one of them (edit --speculative-adaptive-config)")
        argv = set_arg(argv, STEPS, steps)
        argv = set_arg(argv, TOPK, topk)
        argv = set_arg(argv, DRAFT_TOKENS, ndt)
    return Launch(tuple(argv), tuple(sorted(env.items())))


def runs_already(launch: Launch, changes: Mapping[str, Any], read_file=Path.read_text) -> bool:
    """Whether `launch` already runs with `changes`. Comparing rewritten argv lists cannot say:
    `set_arg` moves a rewritten flag to the end, so the launch's own values are rewritten the same
    way and compared instead (a value the launch leaves to SGLang's default counts as different)."""
    argv, env = list(launch.argv), launch.env_dict()
    current: dict[str, Any] = {}
    for k in changes:
        if k == PCIE_IPC_ENV:
            v: Any = env.get(k)
        elif k == PLACEMENT:
            v = SHARDED if get_arg(argv, ATTN_DP) in (None, "1") else None
        else:
            v = get_arg(argv, k)
        if v is None:
            return False
        current[k] = v
    try:
        return apply_settings(launch, changes, read_file) == apply_settings(launch, current, read_file)
    except ArgsError:
        return False


def pinning_config(candidates: list[int]) -> dict[str, Any]:
    """An adaptive config for live step pinning: one batch-size slot holding every candidate, so
    every step has graphs at every batch size, and a warm-up so long that SGLang's own policy never
    moves the tier (the plugin's pin decides; reference §6.4)."""
    from probes.adaptive_policy import write_config
    from probes.sglang_tiers import FREEZE_WARMUP

    steps = sorted({int(s) for s in candidates})
    if not steps or steps[0] < 0:
        raise ArgsError(f"candidate steps must be whole numbers >= 0, got {candidates!r}")
    return write_config({1: steps}, top={"warmup_batches": FREEZE_WARMUP})


def with_pinning(launch: Launch, candidates: list[int], config_path: Path) -> tuple[Launch, dict]:
    """The launch made adaptive with `pinning_config(candidates)` at `config_path` (the caller
    writes the returned config there). Starts on the given steps if it is a candidate."""
    cfg = pinning_config(candidates)
    steps = cfg["1"]["candidate_steps"]
    argv = list(launch.argv)
    current = get_arg(argv, STEPS)
    start = int(current) if current is not None and int(current) in steps else steps[len(steps) // 2]
    if get_arg(argv, TOPK) not in (None, "1"):
        raise ArgsError("live step pinning needs topk 1 (SGLang's adaptive steps are chain-only)")
    argv = set_arg(argv, "speculative_adaptive", True)
    argv = set_arg(argv, "speculative_adaptive_config", str(config_path))
    argv = set_arg(argv, STEPS, start)
    argv = set_arg(argv, TOPK, 1)
    argv = set_arg(argv, DRAFT_TOKENS, start + 1)
    return Launch(tuple(argv), launch.env), cfg
