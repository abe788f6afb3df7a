"""A fleet from what a command was given: URLs (`URL` or `NAME=URL`), `--fleet FILE`, `--router URL`.

The forms add up, in that order, and the names must be unique across them (one line naming the
duplicate). Prometheus discovery plugs in the same way: it returns Members too. Bad input of any
kind is one DiscoveryError line; `rc` says whose fault (2: the command's own inputs, 1: the router).
Must not contact a server other than the router.
"""

from __future__ import annotations

from tuner.fleet.members import DuplicateName, Member, default_name, unique_names
from tuner.fleet.urls import UrlError, checked_url


class DiscoveryError(ValueError):
    """The fleet cannot be had (one line); rc 2 for the command's inputs, 1 for a router."""

    def __init__(self, text: str, rc: int = 2) -> None:
        super().__init__(text)
        self.rc = rc


def member_of_arg(text: str) -> Member:
    """`NAME=URL` or `URL` from the command line (a URL has no `=` before its `://`)."""
    name, sep, rest = text.partition("=")
    if sep and "://" not in name:
        if not name.strip():
            raise DiscoveryError(f"server {text!r}: empty name before '='")
        url = rest
    else:
        name, url = "", text
    try:
        url = checked_url(url)
    except UrlError as e:
        raise DiscoveryError(f"server {name.strip() or text!r}: {e}") from None
    return Member(name.strip() or default_name(url), url)


def discover(urls: list[str], fleet_file: str | None = None, router: str | None = None,
             router_key: str | None = None) -> list[Member]:
    """Every member named, in order; DiscoveryError when none is, or on any bad one."""
    from tuner.fleet.fleet_file import FleetFileError, load_fleet_file
    from tuner.fleet.router import RouterError, router_members

    members = [member_of_arg(u) for u in urls]
    if fleet_file is not None:
        try:
            members += load_fleet_file(fleet_file)
        except FleetFileError as e:
            raise DiscoveryError(f"--fleet {e}") from None
    if router is not None:
        try:
            members += router_members(router, router_key)
        except RouterError as e:
            raise DiscoveryError(str(e), 1) from None
    if not members:
        raise DiscoveryError("no server named: give URLs, --fleet FILE or --router URL")
    try:
        return unique_names(members)
    except DuplicateName as e:
        raise DiscoveryError(str(e)) from None
