"""One module per CLI subcommand: `add_arguments(parser)` and `run(args) -> int`.

Modules keep heavy imports (textual, httpx, sqlite work) inside `run`, so `--help` stays fast.
"""
