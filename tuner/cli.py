"""The `specdecode-tune` command line: a table of subcommands, each in its own module.

Engine-side commands (`serve`, `smoke`, `train-tiny`) run in a fresh interpreter as
`python -m refengine ...`, because tuner/ never imports torch or refengine.
This module must not do any work itself beyond dispatch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from tuner import __version__

# name -> (module under tuner.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "attach": ("attach", "open the TUI on a running server (SGLang or the reference engine)"),
    "demo": ("demo", "start the embedded engine with load and open the TUI on it; tears it all down on exit"),
    "replay": ("replay", "open a recording in the TUI (pause, step, seek, speed)"),
    "analyze": ("analyze", "show where decode time goes in a captured trace (a file or a directory of rank files)"),
    "tune": ("tune", "predict tok/s for every setting from measured costs, apply the best and verify it live"),
    "once": ("once", "watch a server for a few seconds headless and print tok/s, acceptance and the phase split"),
    "record": ("record", "record a server headless into one file (no terminal needed; Ctrl-C/SIGTERM or --duration stops)"),
    "report": ("report", "turn a recording into a report: HTML (inline SVG charts), Markdown or JSON; Perfetto trace; CSV"),
    "doctor": ("doctor", "check a server capability by capability (metrics, plugin, timers, live steps) and print the fix for what is missing"),
    "sglang-flags": ("sglang_flags", "write the SGLang adaptive config and flags that let chosen step tiers be pinned live at every batch size"),
    "launch": ("launch", "start and own an SGLang server (`launch -- python -m sglang.launch_server ARGS…`), relaunching for settings it cannot change live"),
}

# name -> one-line help; these are forwarded to `python -m refengine NAME ...`
ENGINE_COMMANDS: dict[str, str] = {
    "serve": "run the reference EAGLE-3 engine as an SGLang-compatible HTTP server",
    "smoke": "generate across CPU ranks with speculation, switching placement and steps midway",
    "train-tiny": "train the tiny byte-level target and its EAGLE-3 head from the stdlib sources",
}


def commands_markdown() -> str:
    """The README's command table, from the two tables above (tests/test_readme.py keeps them equal)."""
    rows = ["| command | what it does |", "|---|---|"]
    rows += [f"| `{name}` | {text} |" for name, (_, text) in COMMANDS.items()]
    rows += [f"| `{name}` | {text} (runs `python -m refengine {name}`) |" for name, text in ENGINE_COMMANDS.items()]
    return "\n".join(rows)


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors never echo a key (`--api-ke=K could match ...`)."""

    def error(self, message: str):  # noqa: ANN201 - argparse's signature
        super().error(re.sub(r"(--api[\w-]*)=(\S+)", r"\1=***", message))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specdecode-tune",
        description="Profile and tune EAGLE-3 speculative decoding on a running server.",
    )
    parser.add_argument("--version", action="version", version=f"specdecode-tune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in ENGINE_COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(f"tuner.commands.{module}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ENGINE_COMMANDS:
        # Replace this process so signals (Ctrl-C, SIGTERM) reach the engine directly.
        os.execv(sys.executable, [sys.executable, "-m", "refengine", *argv])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(f"tuner.commands.{COMMANDS[args.command][0]}")
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
