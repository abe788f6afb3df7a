"""What a face needs to offer a managed relaunch: the protocol of the relauncher, and which changes
one knob move asks the relaunch for.

Under `specdecode-tune launch` the tool owns the server, so a knob the server cannot change live
(the backend's `Capabilities.needs_restart_for`) can still change: by a relaunch with a rewritten
command (tuner.backends.sglang.managed implements the protocol). Outside managed mode there is no
relauncher and the face says why the knob cannot change, as before.

Standard library and probes.names only: no I/O of its own (`relaunch_keeping_load` calls only what
it is handed), no widgets.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from probes.names import DRAFT_TOKENS, TOPK


class Relauncher(Protocol):
    """The managed server, as the TUI sees it."""

    def proposal(self, changes: Mapping[str, Any]) -> tuple[str, str] | None:
        """(question, command) for a relaunch applying `changes` (the command shell-quoted, secrets
        redacted), or None when the server already runs them. ValueError (one line) for changes
        the server would refuse: nothing is stopped then."""
        ...

    def relaunch(self, changes: Mapping[str, Any], progress: Callable[[str], None]) -> None:
        """Stop the server and start it with `changes` (blocking: a worker thread calls it), with
        `progress(line)` along the way; the relaunch events go to the session's bus. Raises an
        exception with a one-line message when the new setting did not come up (the previous one
        runs again if it could be restarted)."""
        ...


def relaunch_changes(key: str, value: Any, active: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a relaunch needs for one knob move from the `active` setting.

    A launch names steps, topk and draft tokens together, and a tree (topk > 1) needs its size: a
    move to topk > 1 keeps the draft tokens running now (the launch's rules then say whether that
    tree fits). Every other move is the knob alone; its companions are derived from the launch
    (topk 1: draft tokens = steps + 1).
    """
    changes: dict[str, Any] = {key: value}
    if key == TOPK and isinstance(value, int) and value > 1:
        n = active.get(DRAFT_TOKENS)
        if isinstance(n, int) and not isinstance(n, bool):
            changes[DRAFT_TOKENS] = n
    return changes


def relaunch_keeping_load(relauncher: Relauncher, session: Any, changes: Mapping[str, Any],
                          progress: Callable[[str], None], restart_load: Callable[[], Any]) -> str:
    """Relaunch with `changes` (blocking: a worker thread calls it); the session's load driver is
    stopped meanwhile (it would only count errors while the server is away) and `restart_load`
    starts it on the new server. Returns "" or the failure's first line."""
    had_load = session.load is not None
    if had_load:
        session.stop_load()
    try:
        relauncher.relaunch(changes, progress)
        error = ""
    except Exception as exc:   # noqa: BLE001 - a failed relaunch is said, the face goes on
        error = (str(exc).splitlines() or [type(exc).__name__])[0]
    if had_load:
        try:
            restart_load()
        except Exception as exc:   # noqa: BLE001
            session.note(f"load not restarted after the relaunch: {exc}")
    return error
