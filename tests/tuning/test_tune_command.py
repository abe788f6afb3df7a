"""The `tune` command's argument handling, errors, and the text readout of a result."""

import json
import subprocess
import sys

import pytest

from harness import free_port
from tests.tuning.sim import drive, make
from tests.tuning.synth import Truth
from tuner.commands.tune import parse_duration
from tuner.tuning.settings import Setting, settings_space
from tuner.tuning.summary import summary


def test_parse_duration():
    assert parse_duration("300") == 300
    assert parse_duration("90s") == 90
    assert parse_duration("5m") == 300
    for bad in ("", "soon", "-3", "0", "5 minutes"):
        with pytest.raises(ValueError):
            parse_duration(bad)


@pytest.mark.parametrize("argv, rc, needle", [
    (["--budget", "soon"], 2, "not a duration"),
    (["--topk", "1,4"], 2, "--draft-tokens"),
    ([], 1, "cannot connect"),
])
def test_errors_are_one_line(argv, rc, needle):
    url = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "tuner", "tune", url, "--load", "0", *argv],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == rc, out.stderr
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_summary_explains_the_choice():
    truth = Truth(step=2.0, draft0=1.0, comm_share=0.7)
    space = settings_space(7, placements=("sharded", "replicated"))
    clock, engine, session, tuner = make(truth, space, start=Setting(5))
    drive(clock, engine, session, tuner)
    doc = json.loads(json.dumps(tuner.result.to_json()))
    text = "\n".join(summary(doc))
    assert text.startswith("best steps 3 topk 1 draft 4 replicated: +")
    assert "% vs start (A/B) · stopped: " in text.splitlines()[0]
    assert "A/B steps 3 topk 1 draft 4 replicated vs steps 5 topk 1 draft 6 sharded: better" in text
    assert "draft step" in text and "acceptance p_k" in text
    assert "acceptance-only policy" in text
    assert "has no SGLang 0.5.23 flag" in text          # the placement note
    # SGLang cannot move the draft: its flags are for the best setting inside the TP group.
    sg = doc["sglang"]
    assert sg["best"]["placement"] == "sharded"
    assert f"--speculative-num-steps {sg['best']['steps']}" in text


def test_headless_tune_help_names_no_tui_key():
    # `tune` runs without the TUI: its --load help must not send the reader to an l key.
    def help_of(cmd: str) -> str:
        return subprocess.run([sys.executable, "-m", "tuner", cmd, "--help"], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    assert "toggles" not in help_of("tune")
    assert "(l toggles it)" in " ".join(help_of("attach").split())
