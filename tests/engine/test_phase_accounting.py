"""Phase records add up: no phase's collectives exceed the phase, and the phases fit in the wall.

Idle heartbeats and idle config changes broadcast over the group too; they belong to no
iteration, so they must not leak into the next record's `other` (that once read comm > total).
The test asserts on what the ranks recorded: heartbeats are counted, not waited for by the clock.
"""

from harness import wait_until
from tests.engine.conftest import PROMPTS, generate

EPS_MS = 0.05


def _check(records):
    assert records
    for r in records:
        for p, c in r["comm_ms"].items():
            assert c <= r["phase_ms"][p] + EPS_MS, (p, r)
        assert sum(r["phase_ms"].values()) <= r["wall_ms"] + EPS_MS, r


def _rank0_collectives(client) -> int:
    return sum(client.stats()["per_rank"].get(0, {}).get("comm_calls_by_op", {}).values())


def test_idle_broadcasts_do_not_leak_into_the_next_iteration(pool2):
    pool2.set_config({"speculative_num_steps": 2})
    generate(pool2, PROMPTS[:1], max_new=4)           # settled: the config and a first request are done
    # Idle: rank 0 broadcasts a heartbeat every second; wait until its totals show a few more
    # collectives, then change the config while idle (a broadcast and a re-place) and idle across
    # one more heartbeat.
    base = _rank0_collectives(pool2)
    wait_until(lambda: _rank0_collectives(pool2) >= base + 4, 60,
               "idle heartbeats on rank 0 (counted when the idle time is dropped, as it must be)")
    pool2.set_config({"speculative_num_steps": 3})
    pool2.set_config({"speculative_num_steps": 2})
    base = _rank0_collectives(pool2)
    wait_until(lambda: _rank0_collectives(pool2) >= base + 1, 60, "a heartbeat after the idle changes")
    after_idle = generate(pool2, PROMPTS[:1], max_new=8)
    busy = generate(pool2, PROMPTS[:1], max_new=8)     # the same request, straight after another
    _check(after_idle.records)
    _check(busy.records)
    # The first iteration after the idleness carries exactly the collectives of the same first
    # iteration without it (the command broadcast and the prefill): no heartbeat, no idle change.
    first, same = after_idle.records[0], busy.records[0]
    assert first["comm_calls"] == same["comm_calls"], (first["comm_calls"], same["comm_calls"])
    pool2.set_config({"speculative_num_steps": 3})
