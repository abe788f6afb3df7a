"""A setting change sent to several servers at once, and each server's outcome.

Each server is asked on its own thread (Session.set_config: bounded by the control deadline), so a
slow one delays only its own answer. The outcome is `applied`, `refused` with the server's or the
backend's reason, or `needs relaunch` where the backend says the knob only changes by relaunching
(SGLang's topk and draft tokens): then nothing was sent. Must not retry.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

APPLIED, REFUSED, RELAUNCH = "applied", "refused", "needs relaunch"
WAIT_S = 20.0        # past the control deadline (15 s): an answer that never came is a refusal


@dataclass(frozen=True)
class Outcome:
    status: str            # APPLIED | REFUSED | RELAUNCH
    reason: str = ""

    @property
    def text(self) -> str:
        return f"{self.status} ({self.reason})" if self.reason else self.status

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "reason": self.reason}


def outcome_of(session: Any, changes: Mapping[str, Any], by: str) -> Outcome:
    """One server's outcome: asks only when every knob can change live there."""
    backend = session.backend
    for key in changes:
        restart = backend.needs_restart_for(key) if backend is not None else None
        if restart:
            return Outcome(RELAUNCH, restart)
    try:
        result = session.set_config(dict(changes), by=by)
    except Exception as e:  # noqa: BLE001 - a transport or backend failure is this server's refusal
        return Outcome(REFUSED, str(e).splitlines()[0] if str(e) else type(e).__name__)
    return Outcome(APPLIED) if result.ok else Outcome(REFUSED, result.reason)


def apply_to_fleet(sessions: Mapping[str, Any], changes: Mapping[str, Any], by: str = "fleet",
                   wait_s: float = WAIT_S) -> dict[str, Outcome]:
    """Every named session's outcome, in the mapping's order; all asked at once."""
    out: dict[str, Outcome] = {}
    lock = threading.Lock()

    def one(name: str, session: Any) -> None:
        o = outcome_of(session, changes, by)
        with lock:
            out[name] = o

    threads = [threading.Thread(target=one, args=(n, s), name=f"fleet-set-{n}", daemon=True)
               for n, s in sessions.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait_s)
    with lock:
        return {n: out.get(n, Outcome(REFUSED, f"no answer in {wait_s:g} s")) for n in sessions}
