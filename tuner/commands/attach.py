"""`specdecode-tune attach URL [--api-key KEY] [--load N]`: the TUI over a live server.

Opens the session (tuner.commands.options.open_session: key, connection, GPU source) and runs the
app on it. Several URLs, `--fleet`, `--router` or `--prometheus` open the fleet screen
(tuner.screens.fleet) instead, with Prometheus' and the last trace capture's readings laid over it;
`enter` there opens this same single-server view on that server, and quitting it comes back.
Errors before the TUI opens are one line on stderr; nothing is left running when it
returns.
"""

from __future__ import annotations

import argparse

from tuner.backends.load import builtin_prompts
from tuner.commands.fleet_options import add_fleet_server_arguments, fleet_of
from tuner.commands.options import (TUI_GPUS_EVERY_S, OpenError, Opened, add_load_arguments, add_tui_tune_arguments,
                                    api_key, fail, open_session, run_tui, tui_inputs)

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
        members = fleet_of(args)
        if members is not None:
            return _fleet(args, members, api_key(args), inputs)
        with open_session(args, gpus_every_s=TUI_GPUS_EVERY_S) as opened:
            return run_tui(opened, args.load, *inputs, args.max_new_tokens)
    except OpenError as e:
        return fail("attach", e)



def _fleet(args: argparse.Namespace, members: list, key: str | None, inputs: tuple) -> int:
    """The fleet screen; enter runs the single-server view on that server's session, then back."""
    from tuner.fleet.overlays import for_fleet
    from tuner.fleet.poller import FleetPoller
    from tuner.fleet.prometheus import PrometheusError
    from tuner.screens.fleet import FleetApp

    try:
        overlays = for_fleet(members, getattr(args, "prometheus", None))
    except PrometheusError as e:
        raise OpenError(str(e), e.rc) from None
    with FleetPoller(members, key=key, overlays=overlays) as poller:
        while True:
            name = FleetApp(poller).run()
            if name is None:
                return 0
            session = poller.session(name)
            if session is None:
                continue                     # not connected (any more): its row says why
            try:
                run_tui(Opened(session.backend, session, None, None, key), args.load, *inputs, args.max_new_tokens)
            finally:
                poller.give_back(name, closed=True)     # the view closed the session on its way out
