"""The server flags of the commands that take a fleet (`attach`, `once`, `record`, `doctor`):
one or more `URL` / `NAME=URL`, `--fleet FILE`, `--router URL`, `--prometheus URL [--selector SEL]`,
and the key flags.

`fleet_of(args)` says which path a command takes: None for exactly one URL and nothing else (then
`args.url` is that string and the command runs as it always has), else the members
(tuner.fleet.discover), or OpenError with one line. Shared by those commands like `options`; must
not print.
"""

from __future__ import annotations

import argparse

from tuner.commands.keys import add_key_arguments
from tuner.commands.options import OpenError, api_key
from tuner.fleet.members import DuplicateName, Member, unique_names

__all__ = ["add_fleet_server_arguments", "fleet_of"]


def add_fleet_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="*", metavar="URL",
                        help="the server, e.g. http://127.0.0.1:30000; several (URL or NAME=URL) for a fleet")
    parser.add_argument("--fleet", default=None, metavar="FILE",
                        help="a fleet's servers from a TOML file ([servers.NAME] url, api_key_file; docs/fleet.md)")
    parser.add_argument("--router", default=None, metavar="URL",
                        help="the workers of an sglang-router 0.3.x (GET /workers) as the fleet")
    parser.add_argument("--prometheus", default=None, metavar="URL",
                        help="the servers Prometheus scrapes (GET /api/v1/targets) as the fleet; see --selector")
    parser.add_argument("--selector", default=None, metavar="SEL",
                        help='with --prometheus: target labels to match, e.g. \'{job="sglang"}\'')
    add_key_arguments(parser)


def fleet_of(args: argparse.Namespace) -> list[Member] | None:
    """None on the one-server path (args.url set to the one URL); the fleet's members otherwise.
    OpenError: rc 2 for bad or missing input, 1 for a router that is down, slow or lying."""
    from tuner.fleet.discover import DiscoveryError, discover

    urls = list(args.url or [])
    prometheus = getattr(args, "prometheus", None)
    if getattr(args, "selector", None) is not None and prometheus is None:
        raise OpenError("--selector picks Prometheus targets: it needs --prometheus URL", 2)
    if len(urls) == 1 and args.fleet is None and args.router is None and prometheus is None:
        args.url = urls[0]
        return None
    try:
        members = (discover(urls, args.fleet, args.router, api_key(args))
                   if urls or args.fleet is not None or args.router is not None or prometheus is None else [])
    except DiscoveryError as e:
        raise OpenError(str(e), e.rc) from None
    if prometheus is not None:
        members += _from_prometheus(args, prometheus)
    try:
        return unique_names(members)
    except DuplicateName as e:
        raise OpenError(str(e), 2) from None


def _from_prometheus(args: argparse.Namespace, url: str) -> list[Member]:
    """Prometheus' targets as members; what discovery left out (follower nodes without a leader,
    targets that scrape another path) is kept in args.fleet_notes for the command to say."""
    from tuner.fleet.prometheus import PrometheusError, discover_fleet

    try:
        grouping = discover_fleet(url, args.selector)
    except PrometheusError as e:
        raise OpenError(str(e), e.rc) from None
    args.fleet_notes = list(grouping.notes)
    return grouping.members
