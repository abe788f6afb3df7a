"""Phase records are validated with one-line errors, warm-up is dropped, stats summarise groups."""

import pytest

from tests.tuning.synth import Stream, Truth
from tuner.tuning.observations import mean_se, parse_record, settle, summarise
from tuner.tuning.settings import Setting, settings_space


def _rec(**over):
    rec = Stream(Truth()).records(Setting(3), 1, bs=2)[0]
    rec.update(over)
    return rec


def test_parse_good_record():
    it = parse_record(_rec())
    assert it.setting == Setting(3) and it.bs == 2 and it.wall_ms > 0
    assert it.committed == sum(it.accepted) + 2
    assert it.sched_ms >= 0


@pytest.mark.parametrize("over, needle", [
    ({"wall_ms": "fast"}, "wall_ms"),
    ({"wall_ms": float("nan")}, "wall_ms"),
    ({"wall_ms": 0}, "wall_ms"),
    ({"bs": 0}, "bs"),
    ({"phase_ms": [1, 2]}, "phase_ms"),
    ({"accepted": [1, -1]}, "accepted"),
    ({"placement": "moon"}, "placement"),
    ({"topk": 1, "num_draft_tokens": 9}, "num_draft_tokens"),
    ({"steps": None}, "steps"),
])
def test_malformed_record_is_one_line_error(over, needle):
    with pytest.raises(ValueError) as e:
        parse_record(_rec(**over))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_not_a_dict():
    with pytest.raises(ValueError, match="not an object"):
        parse_record([1, 2])


def test_settle_drops_iterations_and_seconds_per_epoch():
    stream = Stream(Truth())
    recs = stream.records(Setting(1), 50) + stream.records(Setting(2), 50)
    iters = [parse_record(r) for r in recs]
    kept = settle(iters, warmup_iters=20, warmup_s=0)
    assert len(kept) == 60
    assert {it.epoch for it in kept} == {1, 2}
    # By time: everything within 0.3 s of its epoch's first record goes.
    kept_t = settle(iters, warmup_iters=0, warmup_s=0.3)
    first = {e: min(i.t for i in iters if i.epoch == e) for e in (1, 2)}
    expected = [i for i in iters if i.t - first[i.epoch] >= 0.3]
    assert kept_t == expected and 0 < len(kept_t) < 100


def test_mean_se_uses_batch_means():
    m, se = mean_se([1.0] * 10 + [2.0] * 10)     # a drift: batch means disagree
    assert m == 1.5 and se > 0.1
    m, se = mean_se([5.0])
    assert m == 5.0 and se > 0


def test_summarise_groups_by_setting_and_bs():
    stream = Stream(Truth())
    recs = stream.records(Setting(1), 10, bs=1) + stream.records(Setting(1), 10, bs=2) \
        + stream.records(Setting(4), 10, bs=1)
    stats = summarise(parse_record(r) for r in recs)
    assert [(s.setting.steps, s.bs, s.n) for s in stats] == [(1, 1, 10), (4, 1, 10), (1, 2, 10)]
    st = stats[0]
    assert sum(st.accepted_hist) == 10 and st.tok_per_s > 0


def test_settings_semantics():
    assert Setting(3).num_draft_tokens == 4
    assert Setting(0, 4, 9).topk == 1 and Setting(0, 4, 9).num_draft_tokens == 1
    assert Setting(0, placement="rank0") == Setting(0)     # off has no placement
    assert Setting(0, placement="rank0").as_server_args() == {"speculative_num_steps": 0}
    with pytest.raises(ValueError, match="candidate pool"):
        Setting(2, 2, 8)         # pool = 2 + 1*4 = 6 < 7
    with pytest.raises(ValueError, match="steps\\+1"):
        Setting(3, 1, 6)
    space = settings_space(3, topks=(1, 2), draft_tokens=(4, 8), placements=("sharded", "rank0"))
    assert Setting(0) in space and Setting(3, 2, 8, "rank0") in space
    assert not any(x.steps == 1 and x.topk == 2 and x.num_draft_tokens == 8 for x in space)
    assert len(space) == len(set(space))
    assert Setting(2, 4, 6, "replicated").as_server_args() == {
        "speculative_num_steps": 2, "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 6, "speculative_draft_placement": "replicated"}
