"""`python -m refengine {smoke,serve,train-tiny} ...`: the engine-side commands.

`serve` and `train-tiny` belong to refengine.server and refengine.train and are imported only
when chosen. Must not import torch at module level (spawned ranks re-import the main module).
"""

from __future__ import annotations

import argparse
import importlib
import sys

DISPATCH = {
    "serve": ("refengine.server", "run the SGLang-compatible HTTP server over the engine"),
    "train-tiny": ("refengine.train", "train the tiny byte-level target and its EAGLE-3 head"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DISPATCH:
        module = importlib.import_module(DISPATCH[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    parser = argparse.ArgumentParser(prog="python -m refengine", description="The reference EAGLE-3 engine.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from refengine import smoke
    smoke.add_arguments(sub.add_parser("smoke", help=smoke.HELP, description=smoke.HELP))
    for name, (_, help_text) in DISPATCH.items():
        sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return smoke.run(args)


if __name__ == "__main__":
    sys.exit(main())
