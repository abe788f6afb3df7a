"""Which settings the tuner measures next (tuner.tuning.probing), from synthetic phase records."""

from tests.tuning.synth import Stream, Truth
from tuner.tuning.cost_model import fit_from_records
from tuner.tuning.probing import lead_placement, next_probes
from tuner.tuning.settings import Setting, settings_space

SPACE = settings_space(5, placements=("sharded", "replicated"))      # the benchmark's 11 settings
START = Setting(3)
REP = "replicated"


def _model(truth: Truth, probes, untimed: bool = False, n: int = 120):
    stream = Stream(truth, seed=1, noise=0.02)
    recs = []
    for s in probes:
        recs += stream.records(s, n, bs=2)
    if untimed:   # collectives inside CUDA graphs: no comm_ms at all
        for r in recs:
            r["comm_ms"] = {}
    return fit_from_records(recs, tp_size=2, warmup_iters=20, warmup_s=0)


SLOW_LINK = Truth(step=2.0, draft0=1.0, comm_share=0.7)     # the draft's collectives dominate
FAST_LINK = Truth(step=0.6, comm_share=0.05)                # leaving the TP group saves nothing


def test_a_slow_link_moves_the_lead_after_the_first_probe():
    """The what-if from the starting setting alone says replicated wins: its deepest and shallowest
    chains come next, not more sharded depths (the slowest iterations on that link) nor tier 0."""
    model = _model(SLOW_LINK, [START])
    assert lead_placement(model, SPACE, START, 2) == REP
    assert next_probes(model, SPACE, START, 2) == [Setting(5, placement=REP), Setting(1, placement=REP)]


def test_a_fast_link_stays_and_needs_one_more_depth():
    model = _model(FAST_LINK, [START])
    assert lead_placement(model, SPACE, START, 2) == "sharded"
    assert next_probes(model, SPACE, START, 2) == [Setting(5)]
    # Two depths, the deepest among them: nothing else could win, so the tuner proposes.
    model = _model(FAST_LINK, [START, Setting(5)])
    assert next_probes(model, SPACE, START, 2) == []


def test_a_dominated_placement_is_completed_only_after_the_proposal():
    model = _model(SLOW_LINK, [START, Setting(5, placement=REP), Setting(1, placement=REP)])
    assert next_probes(model, SPACE, START, 2) == []
    # After the first verification: the starting placement's second depth, so the sharded rows and
    # the SGLang export are fitted rather than missing.
    assert next_probes(model, SPACE, START, 2, complete=True) == [Setting(5)]
    model = _model(SLOW_LINK, [START, Setting(5, placement=REP), Setting(1, placement=REP), Setting(5)])
    assert next_probes(model, SPACE, START, 2, complete=True) == []


def test_a_placement_within_noise_is_measured_before_proposing():
    """The what-if promised a gain that the lead's measurements do not show (its draft compute
    grew): the starting placement may still win at another depth, so it gets its second depth."""
    # Replicated really runs slower than the what-if assumed: fake it by measuring replicated with a
    # truth whose draft is dearer there (a separate stream per placement, the same acceptance).
    truth = SLOW_LINK
    slow_rep = Truth(step=2.0 / 0.3 * 1.2, draft0=1.0 / 0.3 * 1.2, extend0=0.8 / 0.3 * 1.2,
                     extend_n=0.1 / 0.3 * 1.2, comm_share=0.7)
    stream_s, stream_r = Stream(truth, seed=1, noise=0.02), Stream(slow_rep, seed=2, noise=0.02)
    recs = stream_s.records(START, 120, bs=2)
    stream_r.epoch = stream_s.epoch
    for s in (Setting(5, placement=REP), Setting(1, placement=REP)):
        recs += stream_r.records(s, 120, bs=2)
    model = fit_from_records(recs, tp_size=2, warmup_iters=20, warmup_s=0)
    assert Setting(5) in next_probes(model, SPACE, START, 2)


def test_untimed_collectives_measure_the_other_placement():
    """Inside CUDA graphs there is no what-if: the other placement is measured, not assumed free."""
    model = _model(SLOW_LINK, [START], untimed=True)
    assert lead_placement(model, SPACE, START, 2) == "sharded"
    assert next_probes(model, SPACE, START, 2) == [Setting(5)]
    model = _model(SLOW_LINK, [START, Setting(5)], untimed=True)
    assert next_probes(model, SPACE, START, 2)[:2] == [Setting(5, placement=REP), Setting(1, placement=REP)]


def test_speculation_off_is_probed_only_when_it_could_win():
    model = _model(FAST_LINK, [START, Setting(5)])
    assert Setting(0) not in next_probes(model, SPACE, START, 2)
    # Drafts that are almost never accepted: plain decoding may well be the best.
    useless = Truth(step=0.6, comm_share=0.05, p=(0.05, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0))
    model = _model(useless, [START, Setting(5)])
    assert next_probes(model, SPACE, START, 2) == [Setting(0)]


def test_trees_get_one_mid_tree_in_the_lead_placement():
    space = settings_space(5, topks=(1, 4), draft_tokens=(8, 16))
    model = _model(FAST_LINK, [START])
    probes = next_probes(model, space, START, 2)
    assert probes[0] == Setting(5) and any(s.topk == 4 for s in probes)


def test_probes_stay_in_the_space():
    space = [s for s in SPACE if s != Setting(1, placement=REP)]
    model = _model(SLOW_LINK, [START])
    probes = next_probes(model, space, START, 2)
    assert probes and all(s in space for s in probes)
