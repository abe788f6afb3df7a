"""The app's timer can tick between pushing the tune screen and its mount: the tick's redraw must
wait for the panels (it raised NoMatches on a busy machine and ended the app mid-tuning)."""

from __future__ import annotations

from tuner.screens.tune import TuneScreen


class _Untouchable:
    """A tuner that fails the test if the unmounted screen reads anything of it."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the unmounted tune screen read tuner.{name}")


def test_refresh_before_mount_draws_nothing_and_reads_nothing():
    screen = TuneScreen(_Untouchable())
    screen.refresh_view()
    assert screen.view.state == "idle"
