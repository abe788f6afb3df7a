"""Phase records add up: no phase's collectives exceed the phase, and the phases fit in the wall.

Idle heartbeats and idle config changes broadcast over the group too; they belong to no
iteration, so they must not leak into the next record's `other` (that once read comm > total).
"""

import time

from tests.engine.conftest import generate

EPS_MS = 0.05


def _check(records):
    assert records
    for r in records:
        for p, c in r["comm_ms"].items():
            assert c <= r["phase_ms"][p] + EPS_MS, (p, r)
        assert sum(r["phase_ms"].values()) <= r["wall_ms"] + EPS_MS, r


def test_idle_broadcasts_do_not_leak_into_the_next_iteration(pool2):
    time.sleep(2.5)                                   # two idle heartbeats on rank 0
    pool2.set_config({"speculative_num_steps": 2})    # an idle config change: broadcast + re-place
    time.sleep(1.2)
    run = generate(pool2, max_new=8)
    _check(run.records)
    first = run.records[0]
    # The first iteration after 3.7 s of idleness must not carry that idleness in its wall.
    assert first["wall_ms"] < 1500, first
    pool2.set_config({"speculative_num_steps": 3})
