"""Real engine servers on loopback for the TUI tests, and a helper to wait on a running app.

The server is `python -m refengine serve --tp-size 2` on CPU (one thread per rank), started by
tuner.engine_process as a process group, so a kill takes its ranks with it.
"""

from __future__ import annotations

import signal
import time
from typing import Callable

# `tests.harness`, not `harness`: the fixture scripts import this as `python -m tests.tui.make_fixture`.
from tests.harness import ROOT, start_server  # noqa: F401  (ROOT: for the fixture scripts)

# The agreeing random-weight preset: acceptance is real (tau > 1) without the trained model.
MODEL_ARGS = ["--model-path", "tiny-agreeing", "--load-format", "dummy"]


class Engine:
    """One `serve --tp-size 2` (tuner.engine_process); `kill()` takes the ranks with it, `restart()`
    reuses the port."""

    def __init__(self, *args: str, port: int = 0, model_args: list[str] | None = None) -> None:
        """model_args: the model flags; None: the agreeing preset; []: serve's default (the shipped model)."""
        self.args = list(args)
        self.model_args = MODEL_ARGS if model_args is None else list(model_args)
        self.url: str | None = None
        self.port = port
        self._start()

    def _start(self) -> None:
        # die_with_parent: a killed test run must not leave servers behind.
        self.process = start_server([*self.model_args, "--tp-size", "2", "--port", str(self.port), *self.args])
        self.url, self.port = self.process.url, self.process.port

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to the whole process group at once (a crash, as clients see it); nothing is left."""
        self.process.kill(sig)

    def restart(self) -> None:
        self.url = None
        self._start()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)   # whatever ignores SIGTERM is killed after a grace period


async def wait_for(pilot, what: Callable[[], object], timeout: float = 60.0, step: float = 0.25, why: str = ""):
    """Let the app run (its own timer ticks) until `what()` is truthy; fail with `why` otherwise, and
    with the screen and the notifications as they were (a CI failure must say what the app showed)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = what()
        if value:
            return value
        await pilot.pause(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {why or what}\n{app_state(pilot.app)}")


def app_state(app) -> str:
    """The screen and the notifications shown now, for a failure message."""
    try:
        notes = [f"{n.severity}: {n.title} {n.message}" for n in app._notifications]
        return "\n".join(["notifications: " + ("; ".join(notes) or "none"), *screen_lines(app)])
    except Exception as exc:   # noqa: BLE001 - a failure message must not fail
        return f"(the screen could not be read: {exc!r})"


async def click_hint(pilot, widget: str, row: int, hint: str, landed: Callable[[], object],
                     within: float = 15.0) -> None:
    """Click the hint `hint` on line `row` of `widget`'s text and wait until `landed()` says the
    click ran its action.

    The pilot aims at the widget before its first mouse event and clicks two loop turns later: a
    panel that appears or grows in between (the latency panel, a notice) moves things under it. So
    each click waits until the compositor itself has the hint's action at the aimed cell, and a
    click that ran nothing within `within` seconds is aimed anew and sent once more; a second miss
    fails with the screen."""
    app = pilot.app
    for _ in range(2):
        target = app.screen.query_one(widget)
        line = str(target.render()).splitlines()[row]
        dx = line.index(hint) + 1

        def aimed() -> bool:
            x, y = target.region.x + dx, target.region.y + row
            return app.get_widget_at(x, y)[0] is target and "@click" in app.screen.get_style_at(x, y).meta
        await wait_for(pilot, aimed, timeout=within, step=0.05,
                       why=f"{hint!r} in {widget} under the pointer")
        assert await pilot.click(widget, offset=(dx, row))
        try:
            await wait_for(pilot, landed, timeout=within, step=0.1, why="the click's action")
            return
        except AssertionError:
            continue
    raise AssertionError(f"two clicks on {hint!r} in {widget} ran nothing\n{app_state(app)}")


def screen_lines(app) -> list[str]:
    """The terminal as the operator sees it now, one string per row (what the compositor draws)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]
