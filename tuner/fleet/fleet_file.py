"""`--fleet FILE`: a TOML file naming the servers of a fleet, read into Members.

The shape (docs/fleet.md):

    [servers.a]
    url = "http://10.0.0.1:30000"
    api_key_file = "keys/a.key"     # optional; relative to the file's folder

One `[servers.NAME]` table per server, in file order. Any error (unreadable, not TOML, no servers,
a table without a usable url, an unknown key, a repeated url) is one FleetFileError line naming the
file and the server. Must not open a connection or read a key: the key file is only named here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from probes.json_file import JsonFileError, read_bytes
from tuner.fleet.members import Member, unique_names
from tuner.fleet.urls import UrlError, checked_url

if sys.version_info >= (3, 11):
    import tomllib
else:       # pragma: no cover - Python 3.10 has the same parser as the tomli package
    import tomli as tomllib

MAX_FILE_BYTES = 1 << 20
KEYS = {"url", "api_key_file"}


class FleetFileError(ValueError):
    """The fleet file cannot be used (one line naming the file)."""


def load_fleet_file(path: str | os.PathLike) -> list[Member]:
    """The servers of a fleet file, in file order; FleetFileError on anything wrong."""
    name = os.fspath(path)
    try:
        # Regular files only, non-blocking and capped (a FIFO or /dev/zero must not hang us).
        raw = read_bytes(path, MAX_FILE_BYTES)
    except JsonFileError as e:
        raise FleetFileError(str(e).replace("JSON file", "fleet file")) from None
    try:
        doc = tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise FleetFileError(f"{name}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise FleetFileError(f"{name}: not TOML ({str(e).splitlines()[0][:160]})") from None
    servers = doc.get("servers")
    if not isinstance(servers, dict) or not servers:
        raise FleetFileError(f"{name}: no [servers.NAME] tables")
    extra = sorted(set(doc) - {"servers"})
    if extra:
        raise FleetFileError(f"{name}: unknown top-level key {extra[0]!r} (only [servers.NAME] tables)")
    base = Path(name).parent
    members = []
    for server, table in servers.items():
        where = f"{name}: [servers.{server}]"
        if not isinstance(table, dict):
            raise FleetFileError(f"{where} is not a table")
        unknown = sorted(set(table) - KEYS)
        if unknown:
            raise FleetFileError(f"{where}: unknown key {unknown[0]!r} (url, api_key_file)")
        try:
            url = checked_url(table.get("url"))
        except UrlError as e:
            raise FleetFileError(f"{where}: {e}") from None
        key_file = table.get("api_key_file")
        if key_file is not None and (not isinstance(key_file, str) or not key_file):
            raise FleetFileError(f"{where}: api_key_file must be a path")
        key_path = None if key_file is None else (base / key_file if not os.path.isabs(key_file) else Path(key_file))
        members.append(Member(str(server), url, key_path, source="fleet-file"))
    try:
        return unique_names(members)        # TOML refuses a repeated table; kept for one rule everywhere
    except ValueError as e:
        raise FleetFileError(f"{name}: {e}") from None
