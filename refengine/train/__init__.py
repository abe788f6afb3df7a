"""Training the tiny embedded model: the corpus, the byte-level target, the EAGLE-3 head with
training-time test, and the checkpoint files the engine loads.

`main(argv)` is the `train-tiny` command; `python -m refengine train-tiny` dispatches here lazily.
Must not be imported by the engine's serving path (it pulls in training-only code).
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from refengine.train.cli import main as cli_main

    return cli_main(argv)
