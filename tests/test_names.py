"""The shared names (probes.names): one spelling, loaded from the standard library alone, and the
copies that used to live in the engine, the probes and the tuner are now the same objects."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probes import names

ROOT = Path(__file__).resolve().parents[1]


def test_names_loads_nothing_but_the_standard_library():
    code = ("import json, sys; before = set(sys.modules); import probes.names; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    new = json.loads(out.stdout)
    outside = [m for m in new if m.split(".")[0] not in sys.stdlib_module_names
               and m not in ("probes", "probes.names")]
    assert outside == []


def test_every_copy_is_the_shared_one():
    from probes import trace_names
    from refengine import comm, config
    from refengine.server import inputs, options
    from tuner.backends import base
    from tuner.core import series
    from tuner.tuning import observations, settings
    from tuner.widgets import phases
    for phases_copy in (comm.PHASES, trace_names.PHASES, series.PHASES, observations.PHASES, phases.PHASES):
        assert phases_copy is names.ALL_PHASES
    for placements in (config.PLACEMENTS, options.PLACEMENTS, base.PLACEMENTS, settings.PLACEMENTS):
        assert placements is names.PLACEMENTS
    assert names.KNOBS == base.KNOBS == tuple(names.KNOB_RECORD_KEYS)
    from tuner.core import setting as vocab
    assert {k.arg: k.key for k in vocab.KNOBS} == names.KNOB_RECORD_KEYS       # the table's record keys
    # The engine supports a subset of the knobs (SGLang's accept threshold is not one) and takes
    # exactly those, plus the adaptive config and the pin, at /set_internal_state.
    assert set(config.CONFIG_KEYS) < set(names.KNOBS) and names.ACCEPT_THRESHOLD_SINGLE not in config.CONFIG_KEYS
    assert inputs.SETTABLE == (*config.CONFIG_KEYS, names.ADAPTIVE_CONFIG, names.PINNED_STEPS)


def test_prefill_is_a_phase_of_its_own():
    # Records carry prefill beside the decode phases; consumers read ALL_PHASES (prefill first).
    assert names.PREFILL not in names.DECODE_PHASES
    assert names.ALL_PHASES == (names.PREFILL, *names.DECODE_PHASES)


@pytest.mark.parametrize("steps, topk, pool", [(1, 1, 1), (3, 1, 3), (1, 4, 4), (2, 4, 20), (3, 2, 10)])
def test_tree_pool(steps, topk, pool):
    assert names.tree_pool(steps, topk) == pool
    assert names.tree_fits(steps, topk, pool + 1) and not names.tree_fits(steps, topk, pool + 2)


@pytest.mark.parametrize("steps, topk, n", [(2, 4, 21), (2, 4, 22), (3, 2, 11), (3, 2, 12), (1, 4, 5), (1, 4, 6)])
def test_engine_and_tuner_agree_on_the_tree_bound(steps, topk, n):
    from refengine.config import ConfigError, ModelLimits, SpecConfig, resolve_config
    from tuner.tuning.settings import Setting
    limits = ModelLimits(max_draft_tokens=64)
    try:
        resolve_config(SpecConfig(), {names.STEPS: steps, names.TOPK: topk, names.DRAFT_TOKENS: n}, limits)
        engine_ok = True
    except ConfigError:
        engine_ok = False
    try:
        Setting(steps, topk, n)
        tuner_ok = True
    except ValueError:
        tuner_ok = False
    assert engine_ok == tuner_ok == names.tree_fits(steps, topk, n)


def test_the_sglang_plugins_records_use_only_known_keys():
    from probes.inserver.sglang_timing import HostEvent, PhaseTimeline
    tl = PhaseTimeline(HostEvent, accept_wait=0)
    tl.begin(bs=1, steps=1, topk=1, num_draft_tokens=2)
    tl.close(tl.open("draft"))
    tl.end()
    tl.accepted([1])
    [rec] = tl.poll()
    assert set(rec) <= names.RECORD_KEYS
    assert set(rec["phase_ms"]) == set(names.ALL_PHASES)


def test_the_sglang_plugins_epoch_is_every_knob_it_is_given():
    """A knob given to begin() (by its record key) is in the record and makes the config epoch, but
    the steps an adaptive controller picks per batch."""
    from probes.inserver.sglang_timing import HostEvent, PhaseTimeline
    tl = PhaseTimeline(HostEvent, accept_wait=0)
    knobs = {names.R_STEPS: 1, names.R_TOPK: 1, names.R_DRAFT_TOKENS: 2, names.R_ACCEPT_THRESHOLD_SINGLE: 1.0}
    for threshold, steps, controller in ((1.0, 1, False), (1.0, 1, False), (0.5, 1, False), (0.5, 1, True),
                                         (0.5, 3, True)):
        tl.begin(bs=1, **{**knobs, names.R_ACCEPT_THRESHOLD_SINGLE: threshold, names.R_STEPS: steps},
                 controller=controller)
        tl.end()
        tl.accepted([0])
    recs = tl.poll()
    assert [r[names.R_EPOCH] for r in recs] == [0, 0, 1, 2, 2]
    assert [r[names.R_ACCEPT_THRESHOLD_SINGLE] for r in recs] == [1.0, 1.0, 0.5, 0.5, 0.5]
    assert [r[names.R_STEPS] for r in recs] == [1, 1, 1, 1, 3] and recs[0][names.R_PLACEMENT] == names.SHARDED
