"""Per batch-size slot tiers from SGLang's adaptive log lines (tuner.tuning.adaptive_tiers)."""

from __future__ import annotations

from pathlib import Path

from tuner.backends.sglang.log import LogTail, parse_line, parse_tier_line
from tuner.tuning.adaptive_tiers import ChosenTier, chosen_tiers

LOG = Path(__file__).parents[1] / "sglang" / "fixtures" / "server_tp8_adaptive.log"


def _line(t: str, msg: str) -> str:
    return f"[2026-01-01 12:00:{t} TP0] {msg}"


def _decode(t: str, bs: int):
    return parse_line(_line(t, f"Decode batch, #running-req: {bs}, #token: 10, token usage: 0.01, "
                               f"cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0"), utc_offset_s=0)


def _switch(t: str, old: int, new: int):
    return parse_tier_line(_line(t, f"Switch adaptive runtime state: steps {old} -> {new}, "
                                    f"draft_tokens {old + 1} -> {new + 1}"), utc_offset_s=0)


def test_each_move_goes_to_the_slot_of_the_nearest_decode_lines_batch():
    decodes = [_decode("00", 2), _decode("10", 12), _decode("20", 40), _decode("30", 3)]
    moves = [_switch("01", 3, 5),      # near bs 2   -> slot 1
             _switch("11", 5, 1),      # near bs 12  -> slot 8
             _switch("19", 1, 0),      # near bs 40  -> slot 32
             _switch("29", 0, 5),      # back to bs 3 -> slot 1 again (its newest)
             _switch("25", 0, 1)]      # a tie between 20 (bs 40) and 30 (bs 3): the later line's
    got = chosen_tiers(moves, decodes)
    assert got == {
        1: ChosenTier(slot=1, steps=5, t=moves[3].t, batch=3, moves=3),
        8: ChosenTier(slot=8, steps=1, t=moves[1].t, batch=12, moves=1),
        32: ChosenTier(slot=32, steps=0, t=moves[2].t, batch=40, moves=1),
    }
    # The config's own thresholds route the same batch elsewhere.
    assert {k: v.steps for k, v in chosen_tiers(moves[:2], decodes, slots=[1, 16]).items()} == {1: 1}


def test_no_decode_line_means_no_slot_and_the_fixture_log():
    assert chosen_tiers([_switch("01", 3, 4)], []) == {}
    decodes, tiers = LogTail(LOG, utc_offset_s=0).poll_all()
    got = chosen_tiers(tiers, decodes, slots={"1": {}, "8": {}})
    assert {k: (v.steps, v.batch, v.moves) for k, v in got.items()} == {1: (4, 4, 2)}


def test_the_same_from_a_store_the_log_feed_filled():
    from tuner.backends.sglang.log import log_samples
    from tuner.core.store import Store
    from tuner.tuning.adaptive_tiers import chosen_tiers_in

    decodes = [_decode("00", 2), _decode("10", 12)]
    moves = [_switch("01", 3, 5), _switch("11", 5, 1)]
    store = Store()
    store.add_many(log_samples(decodes, moves))
    got = chosen_tiers_in(store)
    assert {k: (v.steps, v.batch) for k, v in got.items()} == {1: (5, 2), 8: (1, 12)}
    assert chosen_tiers_in(store, t1=moves[0].t) == {1: got[1].__class__(1, 5, moves[0].t, 2, 1)}
