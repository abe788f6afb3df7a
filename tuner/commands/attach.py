"""`specdecode-tune attach URL [--api-key KEY] [--load N]`: the TUI over a live server.

Connects (detecting the server kind), builds the headless session, starts the local samplers the
backend says make sense, and runs the app. Errors before the TUI opens are one line on stderr;
nothing is left running when it returns.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner.backends.load import builtin_prompts
from tuner.core.pyspy import pyspy_top

__all__ = ["add_arguments", "add_load_arguments", "add_tui_tune_arguments", "builtin_prompts", "gpu_labels",
           "prompts_for", "pyspy_top", "run", "run_tui", "start_nvml", "tui_inputs"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tuner.commands.keys import add_key_arguments

    parser.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:30000")
    add_key_arguments(parser)
    add_load_arguments(parser)
    add_tui_tune_arguments(parser)


def add_load_arguments(parser: argparse.ArgumentParser, tui: bool = True) -> None:
    """--load, --prompts, --max-new-tokens; tui: the TUI's l key toggles the load (said in --help)."""
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="keep N generate requests in flight from the start"
                             + (" (l toggles it)" if tui else ""))
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL prompts for the load ({\"text\": ...} per line; default: built-in)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per load request")


def add_tui_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """What the TUI's tune key (`u`) may spend and search (the `tune` command has its own flags)."""
    parser.add_argument("--tune-budget", default="120s", metavar="D",
                        help="time the tune key's tuner may take (e.g. 90s, 5m; default 120s)")
    parser.add_argument("--tune-max-steps", type=int, default=5, metavar="N",
                        help="deepest chain the tune key considers (default 5)")
    parser.add_argument("--tune-topk", default="1", metavar="K,...",
                        help="topk values the tune key considers, e.g. 1,4 (trees also need --tune-draft-tokens)")
    parser.add_argument("--tune-draft-tokens", default="", metavar="N,...",
                        help="num_draft_tokens values for the tune key's trees, e.g. 8,16")


def tui_inputs(args: argparse.Namespace, prog: str) -> tuple[list[dict], dict] | None:
    """(prompts, make_app's tune_* keywords) from attach's and demo's flags, or None after a
    one-line error on stderr."""
    from tuner.commands.duration import parse_duration
    from tuner.commands.tune import MAX_STEPS_BOUND, int_list

    def fail(msg: str) -> None:
        print(f"specdecode-tune {prog}: {msg}", file=sys.stderr)

    try:
        prompts = prompts_for(args)
    except (OSError, ValueError) as e:
        return fail(f"prompts: {e}")
    try:
        budget = parse_duration(args.tune_budget)
    except ValueError as e:
        return fail(f"--tune-budget: {e}")
    if not 1 <= args.tune_max_steps <= MAX_STEPS_BOUND:
        return fail(f"--tune-max-steps must be between 1 and {MAX_STEPS_BOUND}")
    lists = {}
    for flag, text in (("--tune-topk", args.tune_topk), ("--tune-draft-tokens", args.tune_draft_tokens)):
        try:
            lists[flag] = tuple(int_list(text))
        except argparse.ArgumentTypeError as e:
            return fail(f"{flag}: {e}")
    return prompts, {"tune_budget_s": budget, "tune_max_steps": args.tune_max_steps,
                     "tune_topks": lists["--tune-topk"] or (1,), "tune_draft_tokens": lists["--tune-draft-tokens"]}


def prompts_for(args: argparse.Namespace) -> list[dict]:
    """The --prompts file, else the built-in prompts; a bad file raises ValueError with one line."""
    from tuner.backends.load import load_prompts
    return load_prompts(args.prompts) if args.prompts else builtin_prompts()


def run(args: argparse.Namespace) -> int:
    from tuner.backends import ServerError, connect
    from tuner.commands.keys import ApiKeyError, api_key_of
    from tuner.core.text import terminal_safe

    if args.load < 0:
        print("specdecode-tune attach: --load must be 0 or more", file=sys.stderr)
        return 2
    inputs = tui_inputs(args, "attach")
    if inputs is None:
        return 2
    prompts, limits = inputs
    try:
        backend = connect(args.url, api_key=api_key_of(args))
    except ApiKeyError as e:
        print(f"specdecode-tune attach: {e}", file=sys.stderr)
        return 2
    except ServerError as e:
        print(terminal_safe(f"specdecode-tune attach: {e}"), file=sys.stderr)
        return 1
    return run_tui(backend, args.load, prompts, args.max_new_tokens, tune=limits)


def run_tui(backend, load: int, prompts: list[dict], max_new_tokens: int = 128,
            tune: dict | None = None) -> int:
    """Run the TUI over a backend until the operator quits; the session is closed on the way out."""
    from tuner.app import make_app
    from tuner.core.session import Session

    session = Session(backend)
    sampler = start_nvml(session)
    labels = gpu_labels(sampler)
    try:
        make_app(session, load=load, prompts=prompts, max_new_tokens=max_new_tokens, gpu_labels=labels,
                 **(tune or {})).run()
    finally:
        if sampler is not None:
            sampler.stop()
        session.close()
    return 0


def start_nvml(session, interval_s: float = 0.1):
    """NVML readings of this host's GPUs onto the session's bus every `interval_s`, when the
    server's GPUs are here.

    Returns the started sampler, or None: a host without NVML (or a server elsewhere) gets no
    readings, which the GPU panel explains; that is not an error.
    """
    from probes.nvml import NvmlSampler
    from tuner.core.records import Sample

    backend = session.backend
    if backend is None or backend.READ_ONLY or not backend.LOCAL_GPUS:
        return None
    sampler = NvmlSampler(lambda t, series, value: session.put(Sample(t, series, value)), session.clock,
                          interval_s=interval_s, rank_info=backend.rank_info)
    if not sampler.available:
        return None
    sampler.start()
    return sampler


def gpu_labels(sampler) -> dict[int, str]:
    """`H200 r0` per GPU index: the short device name and the server rank on it, when known."""
    if sampler is None:
        return {}
    out = {}
    for d in sampler.devices:
        name = d.name.replace("NVIDIA ", "").split()[0] if d.name else ""
        out[d.index] = f"{name} r{d.rank}" if d.rank is not None else name
    return out
