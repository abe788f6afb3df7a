"""`attach` against a server whose /metrics trickles (D3, D18): the TUI header says degraded with the
reason (never connected), the event log says so, and quitting ends the app and the session whatever
the server is doing."""

from __future__ import annotations

import asyncio
import threading

from tests.tui.helpers import wait_for
from tuner.app import make_app
from tuner.backends import connect
from tuner.core.session import Session


def test_attach_shows_degraded_and_quits(hostile):
    s = hostile(metrics="trickle", trickle_s=0.5)
    session = Session(connect(s.url))
    app = make_app(session, load=0)

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            header = lambda: str(app.main.query_one("#header").render())   # noqa: E731
            await wait_for(pilot, lambda: "degraded" in header(), why="the degraded state in the header")
            assert "connected" not in header().replace("disconnected", "")
            assert "/metrics: no full answer within 5 s" in header()
            await wait_for(pilot, lambda: "degraded: /metrics: no full answer" in app.main.query_one("#events").plain(),
                           why="the degraded event in the log")
            await pilot.press("q")

    asyncio.run(scenario())
    assert app.return_code in (0, None)
    # What attach does on the way out: close the session. A poll in flight ends at its deadline.
    closer = threading.Thread(target=session.close, daemon=True)
    closer.start()
    closer.join(120)                     # a hang detector, not a timing assertion
    assert not closer.is_alive(), "closing the session hung on the trickling server"
