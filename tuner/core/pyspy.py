"""py-spy over the session's server: the glue behind the TUI's py-spy key.

The instrument (probes.pyspy) samples processes; this picks the server's rank processes from the
backend's rank info and refuses a server on another host (py-spy sees only this host's processes).
Blocks for the sample's length: callers run it off their ticking thread. Must not import textual.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def pyspy_top(session: Any) -> Any:
    """Top functions, idle and GIL shares of the server's processes on this host."""
    from probes.pyspy import sample_processes

    pids = [int(r["pid"]) for r in session.backend.rank_info if r.get("pid")]
    if not pids:
        raise RuntimeError("the server did not say which processes are its ranks")
    if not session.backend.LOCAL_GPUS and not is_local(session.backend.url):
        raise RuntimeError("py-spy sees only this host's processes, and the server runs elsewhere")
    return sample_processes(pids, duration_s=2.0)


def is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")
