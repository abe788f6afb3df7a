"""The SGLang-compatible HTTP server in front of the engine's ranks (`specdecode-tune serve`).

Importing this package is cheap: the server and the engine load only when `main` runs.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from refengine.server.app import main as _main

    return _main(argv)
