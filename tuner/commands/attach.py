"""`specdecode-tune attach URL [--api-key KEY] [--load N]`: the TUI over a live server.

Opens the session (tuner.commands.options.open_session: key, connection, GPU source) and runs the
app on it. Several URLs, `--fleet`, `--router` or `--prometheus` open the fleet screen
(tuner.screens.fleet) instead, with Prometheus' and the last trace capture's readings laid over it;
`enter` there opens this same single-server view on that server, and quitting it comes back. With
`--router` the screen opens whatever the router answers: it is asked again every few seconds
(tuner.fleet.router_watch), its problems are a line in the screen's status line, its new workers rows.
Errors before the TUI opens are one line on stderr; nothing is left running when it
returns.
"""

from __future__ import annotations

import argparse

from tuner.backends.load import builtin_prompts
from tuner.commands.fleet_options import add_fleet_server_arguments, fleet_of
from tuner.commands.options import (TUI_GPUS_EVERY_S, OpenError, Opened, add_load_arguments, add_tui_tune_arguments,
                                    api_key, fail, open_session, run_fleet, run_tui, tui_inputs)

__all__ = ["add_arguments", "builtin_prompts", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_server_arguments(parser)
    add_load_arguments(parser)
    add_tui_tune_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.load < 0:
        return fail("attach", "--load must be 0 or more", 2)
    try:
        inputs = tui_inputs(args)
        router, args.router = args.router, None
        if router is not None:
            # The router is asked from the fleet screen (again every few seconds): a router that is
            # down, slow or lying is a line in its status line, not a reason not to open.
            return _fleet(args, _others(args), api_key(args), inputs, router)
        members = fleet_of(args)
        if members is not None:
            return _fleet(args, members, api_key(args), inputs)
        with open_session(args, gpus_every_s=TUI_GPUS_EVERY_S) as opened:
            return run_tui(opened, args.load, *inputs, args.max_new_tokens)
    except OpenError as e:
        return fail("attach", e)



def _others(args: argparse.Namespace) -> list:
    """The members named besides --router (URLs, --fleet, --prometheus); [] when none is."""
    from tuner.fleet.discover import DiscoveryError, member_of_arg

    if not args.url and args.fleet is None and getattr(args, "prometheus", None) is None:
        return []
    members = fleet_of(args)
    if members is not None:
        return members
    try:
        return [member_of_arg(args.url)]
    except DiscoveryError as e:
        raise OpenError(str(e), e.rc) from None


def _fleet(args: argparse.Namespace, members: list, key: str | None, inputs: tuple, router: str | None = None) -> int:
    """The fleet screen; enter runs the single-server view on that server's session, then back."""
    from tuner.fleet.overlays import Refreshing, for_fleet
    from tuner.fleet.poller import FleetPoller
    from tuner.fleet.prometheus import PrometheusError
    from tuner.fleet.router_watch import EVERY_S, RouterWatch

    try:
        overlays = for_fleet(members, getattr(args, "prometheus", None))
    except PrometheusError as e:
        raise OpenError(str(e), e.rc) from None
    watch = RouterWatch(router, key) if router is not None else None
    if watch is not None:
        overlays.insert(0, Refreshing(watch, EVERY_S))
    poller = FleetPoller(members, key=key, overlays=overlays)
    if watch is not None:
        watch.poller = poller
    return run_fleet(poller, lambda session: run_tui(Opened(session.backend, session, None, None, key), args.load,
                                                     *inputs, args.max_new_tokens))
