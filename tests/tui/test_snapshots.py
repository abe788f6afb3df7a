"""Snapshot tests of the TUI over the committed recording of the real engine (see scenarios.py), at
120x40 and, for the main screen, at 100x30 and 80x24 (a panel added later must pass these too).

Update only on purpose: `pytest tests/tui/test_snapshots.py --snapshot-update`, after looking at
the report of the failing run (snapshot_report.html).
"""

from __future__ import annotations

import pytest

from .scenarios import SCENARIOS, replay_app


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_replay_snapshot(scenario, snap_compare):
    assert snap_compare(replay_app(scenario), press=scenario.press, terminal_size=scenario.size)
