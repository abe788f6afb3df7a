"""The Backend contract's defaults for what only a recording does: `pump` produces nothing on the
session's thread, and `seek` is refused in one line before the store is touched."""

from __future__ import annotations

import pytest

from tuner.backends.base import Backend, Capabilities
from tuner.core.records import Sample
from tuner.core.session import Session


class Live(Backend):
    """A live server's shape: it produces on its own threads (here: nothing)."""

    kind = "live"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    def start(self, bus, clock) -> None:
        pass

    def stop(self) -> None:
        pass


def test_a_live_backend_pumps_nothing_and_cannot_seek():
    backend = Live()
    session = Session(backend)
    assert backend.pump() == 0 and not backend.can_seek
    session.put(Sample(1.0, "server/tok_per_s", 5.0))
    assert session.tick() == 1
    with pytest.raises(RuntimeError, match="cannot seek"):
        session.seek(0.0)
    assert len(session.store.window("server/tok_per_s", 0.0, 2.0).v) == 1   # nothing lost
