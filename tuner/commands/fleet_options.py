"""The server flags of the commands that take a fleet (`attach`, `once`, `record`, `doctor`):
one or more `URL` / `NAME=URL`, `--fleet FILE`, `--router URL`, and the key flags.

`fleet_of(args)` says which path a command takes: None for exactly one URL and nothing else (then
`args.url` is that string and the command runs as it always has), else the members
(tuner.fleet.discover), or OpenError with one line. Shared by those commands like `options`; must
not print.
"""

from __future__ import annotations

import argparse

from tuner.commands.keys import add_key_arguments
from tuner.commands.options import OpenError, api_key
from tuner.fleet.members import Member

__all__ = ["add_fleet_server_arguments", "fleet_of"]


def add_fleet_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="*", metavar="URL",
                        help="the server, e.g. http://127.0.0.1:30000; several (URL or NAME=URL) for a fleet")
    parser.add_argument("--fleet", default=None, metavar="FILE",
                        help="a fleet's servers from a TOML file ([servers.NAME] url, api_key_file; docs/fleet.md)")
    parser.add_argument("--router", default=None, metavar="URL",
                        help="the workers of an sglang-router 0.3.x (GET /workers) as the fleet")
    add_key_arguments(parser)


def fleet_of(args: argparse.Namespace) -> list[Member] | None:
    """None on the one-server path (args.url set to the one URL); the fleet's members otherwise.
    OpenError: rc 2 for bad or missing input, 1 for a router that is down, slow or lying."""
    from tuner.fleet.discover import DiscoveryError, discover

    urls = list(args.url or [])
    if len(urls) == 1 and args.fleet is None and args.router is None:
        args.url = urls[0]
        return None
    try:
        return discover(urls, args.fleet, args.router, api_key(args))
    except DiscoveryError as e:
        raise OpenError(str(e), e.rc) from None
