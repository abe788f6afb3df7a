"""The headless core against the real `specdecode-tune serve --tp-size 2` on CPU (issue "Done when"):
the short headless command shows tok/s, acceptance, per-position acceptance and per-phase times with
their comm parts; a live change through the backend is seen in the next readings; a recording of it
replays record for record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import wait_until
from tuner.backends import connect
from tuner.backends.base import DRAFT_TOKENS, PLACEMENT, STEPS
from tuner.backends.refengine import RefEngineBackend
from tuner.backends.load import builtin_prompts
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.session import Session
from tuner.recording import Recorder, header_for, open_recording
from tuner.recording.replay import ReplayBackend

# Not `from conftest import ROOT`: run together with tests/report, "conftest" is that one.
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def wait_for(session, cond, timeout=60.0):
    """Tick the session until `cond()` holds."""
    return wait_until(lambda: (session.tick(), cond())[-1], timeout, "the session's readings", interval=0.1)


def test_once_prints_the_readings(serve_tp2):
    out = subprocess.run([sys.executable, "-m", "tuner", "once", serve_tp2.url, "--load", "2", "--seconds", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "refengine" in text and "TP 2" in text
    tok = float(text.split("tok/s")[1].split()[0])
    assert tok > 0
    assert "accept    length" in text and "p1 " in text and "p3 " in text and "a2 " in text
    for phase in ("draft", "verify", "verify_sample", "draft_extend"):
        assert f"  {phase} " in text
    assert "comm ms" in text


def test_live_change_is_seen_in_the_next_readings_and_replays_record_for_record(serve_tp2, tp2_config, tmp_path):
    backend = connect(serve_tp2.url)
    assert isinstance(backend, RefEngineBackend)
    path = tmp_path / "live.db"
    drained = []

    class Tee:
        """The recorder, plus a copy of exactly what the session handed it."""

        def __init__(self, rec):
            self.rec = rec

        def write(self, records):
            drained.extend(records)
            self.rec.write(records)

        def close(self):
            self.rec.close()

    session = Session(backend, recorder=Tee(Recorder(path, header_for(backend, command="test"))))
    session.start()
    try:
        session.start_load(builtin_prompts(), 2, max_new_tokens=32)
        assert wait_for(session, lambda: len(session.store.window(S.phase_ms("draft")).finite()) >= 3)
        assert session.store.value(S.SPEC_NUM_STEPS) == 3
        res = session.set_config({STEPS: 2, PLACEMENT: "replicated"})
        assert res.ok, res.reason
        assert res.active[STEPS] == 2 and res.active[DRAFT_TOKENS] == 3
        # The change point is the first phase record with the new epoch; readings after it follow.
        assert wait_for(session, lambda: (e := session.store.last_event(EventKind.CONFIG_CHANGED)) is not None
                        and e.data["new"][STEPS] == 2)
        change = session.store.last_event(EventKind.CONFIG_CHANGED)
        assert change.data["new"][PLACEMENT] == "replicated" and change.data["old"][STEPS] == 3
        assert wait_for(session, lambda: len(session.store.window(S.phase_ms("draft"), change.t + 0.01).finite()) >= 2)
        st = session.store
        assert st.value(S.SPEC_NUM_STEPS) == 2
        after = st.window(S.accept_pos(1), change.t + 0.01).finite()
        assert after and all(0 <= v <= 1 for v in after)
        assert st.window(S.accept_pos(3), change.t + 0.01).t == ()          # only steps positions now
        # The draft runs replicated: no collectives in the draft phase any more.
        assert max(st.window(S.phase_comm_ms("draft"), change.t + 0.01).finite()) == 0.0
        assert st.latest(S.LOAD_TOK_PER_S) is not None
        refused = session.set_config({DRAFT_TOKENS: 7})                     # topk=1 fixes it at steps+1
        assert not refused.ok and refused.reason and "\n" not in refused.reason
        assert session.set_config({STEPS: 3, PLACEMENT: "sharded"}).ok
    finally:
        session.close()

    with open_recording(path) as r:
        assert r.problem is None
        assert r.header["server_info"]["kind"] == "refengine" and r.header["launch"]["tp_size"] == 2
        assert r.header["active"]["speculative_num_steps"] == 3 and len(r.header["ranks"]) == 2
        assert list(r.records()) == drained
    replayed = []

    class Sink:
        def write(self, records):
            replayed.extend(records)

        def close(self):
            pass

    rb = ReplayBackend(path, paused=True)
    rs = Session(rb, recorder=Sink()).start()
    while not rb.ended:
        rb.step(5.0)
        rs.tick()
    rs.close()
    assert replayed == drained
