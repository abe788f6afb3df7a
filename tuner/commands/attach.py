"""`specdecode-tune attach URL [--api-key KEY] [--load N]`: the TUI over a live server.

Opens the session (tuner.commands.options.open_session: key, connection, GPU source) and runs the
app on it. Errors before the TUI opens are one line on stderr; nothing is left running when it
returns.
"""

from __future__ import annotations

import argparse

from tuner.backends.load import builtin_prompts
from tuner.commands.options import (TUI_GPUS_EVERY_S, OpenError, add_load_arguments, add_server_arguments,
                                    add_tui_tune_arguments, fail, open_session, run_tui, tui_inputs)

__all__ = ["add_arguments", "builtin_prompts", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    add_load_arguments(parser)
    add_tui_tune_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.load < 0:
        return fail("attach", "--load must be 0 or more", 2)
    try:
        inputs = tui_inputs(args)
        with open_session(args, gpus_every_s=TUI_GPUS_EVERY_S) as opened:
            return run_tui(opened, args.load, *inputs, args.max_new_tokens)
    except OpenError as e:
        return fail("attach", e)

