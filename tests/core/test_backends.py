"""Backends over real HTTP on loopback, against the stand-in server (core_standin.py): detection,
derived series, control reply semantics, capabilities, bad answers and disconnects."""

from __future__ import annotations

import math

import pytest

from core_standin import StandIn
from tuner.backends import ServerError, connect
from tuner.backends.base import DRAFT_TOKENS, PLACEMENT, STEPS, TOPK
from tuner.backends.refengine import RefEngineBackend
from tuner.backends.sglang import REFUSED_BY_SGLANG, SGLangBackend
from tuner.core import series as S
from tuner.core.events import EventKind
from tuner.core.session import Session


def kinds(session):
    return [e.kind for e in session.store.events()]


def test_connect_detects_our_engine_and_reads_active_not_launch(standin):
    standin.config["steps"] = 2
    b = connect(standin.url)
    try:
        assert isinstance(b, RefEngineBackend)
        info = b.info
        assert info["kind"] == "refengine" and info["tp_size"] == 2 and info["model"] == "tiny-llama"
        assert info["active"][STEPS] == 2                 # internal_states[0]
        assert info["launch"][STEPS] == 3                 # the top level stays the launch value
        caps = b.capabilities
        assert caps.can_set(STEPS) and caps.can_set(PLACEMENT) and caps.CAN_FETCH_TRACE and b.HAS_PHASE_TIMERS
        assert b.why_not(PLACEMENT) is None and b.needs_restart_for(STEPS) is None
    finally:
        b.stop()


def test_connect_detects_sglang_and_explains_what_it_cannot_do():
    sg = StandIn(kind="sglang").start()
    try:
        b = connect(sg.url)
        assert isinstance(b, SGLangBackend) and b.plugin is None
        caps = b.capabilities
        assert not caps.can_set(STEPS) and not caps.can_set(PLACEMENT) and caps.CAN_CAPTURE_TRACE
        assert "plugin" in caps.why_not(STEPS)
        assert "relaunch" in caps.needs_restart_for(TOPK)
        assert "placement" in caps.why_not(PLACEMENT)
        assert not caps.HAS_PHASE_TIMERS and "plugin" in caps.reasons["phase_timers"]
        b.stop()
    finally:
        sg.stop()


def test_connect_errors_are_one_line():
    with pytest.raises(ServerError, match="cannot connect"):
        connect("http://127.0.0.1:9")
    s = StandIn().start()
    try:
        s.mode = "html"
        with pytest.raises(ServerError, match="HTML page"):
            connect(s.url)
        s.mode = "500"
        with pytest.raises(ServerError, match="HTTP 500"):
            connect(s.url)
    finally:
        s.stop()


def test_refengine_series_from_metrics_and_phase_stream(standin, wire):
    b = RefEngineBackend(standin.url)
    session, clock = wire(b)
    standin.iterate([1, 2])            # history before attaching: not counted
    assert b.poll_server_info() and b.poll_metrics() and b.poll_phases()
    session.tick()
    assert kinds(session)[:2] == [EventKind.CONNECTED, EventKind.SERVER_INFO]
    assert session.active_config()[STEPS] == 3
    assert session.store.latest(S.phase_ms("draft")) is None
    # Three iterations of batch 2 in the next 0.5 s.
    for acc in ([3, 0], [2, 1], [3, 3]):
        standin.iterate(acc)
    clock.advance(0.5)
    b.poll_metrics()
    b.poll_phases()
    session.tick()
    st = session.store
    assert st.value(S.SERVER_TOK_PER_S) == pytest.approx((4 + 1 + 3 + 2 + 4 + 4) / 0.5)
    # Histogram of accepted drafts over these iterations: h = [1, 1, 1, 3].
    assert st.value(S.accept_pos(1)) == pytest.approx(5 / 6)
    assert st.value(S.accept_pos(2)) == pytest.approx(4 / 6)
    assert st.value(S.accept_pos(3)) == pytest.approx(3 / 6)
    assert st.value(S.accept_cond(3)) == pytest.approx(3 / 4)
    assert st.value(S.SPEC_ACCEPT_LEN) == pytest.approx(1 + (5 + 4 + 3) / 6)
    assert st.value(S.SPEC_ACCEPT_RATE) == pytest.approx(12 / (6 * 3))
    assert st.value(S.phase_ms("draft")) == pytest.approx(3.0)
    assert st.value(S.phase_comm_ms("verify")) == pytest.approx(1.5)
    assert st.value(S.PHASE_IDLE_MS) == pytest.approx(0.0)
    assert st.value(S.SERVER_ITERATIONS) == 3 and st.value(S.SERVER_BATCH) == 2
    assert st.value(S.SERVER_RUNNING) == 2
    # Acceptance comes from the phase stream only: one reading per poll, not two sources.
    assert len(st.window(S.SPEC_ACCEPT_LEN)) == 1
    assert b.rank_info[1]["pid"] == "12"


def test_live_change_refengine(standin, wire):
    b = RefEngineBackend(standin.url)
    session, clock = wire(b)
    b.poll_server_info(); b.poll_phases()
    standin.iterate([1]); clock.advance(0.25); b.poll_phases()
    res = session.set_config({STEPS: 2})
    assert res.ok and res.active[STEPS] == 2 and res.active[DRAFT_TOKENS] == 3
    assert standin.posts[-1] == {"server_args": {STEPS: 2}}
    session.tick()
    assert session.active_config()[STEPS] == 2          # read back at once (config_active)
    assert session.store.last_event(EventKind.CONFIG_CHANGED) is None
    standin.iterate([2]); standin.iterate([1])
    clock.advance(0.25)
    b.poll_phases()
    session.tick()
    ch = session.store.last_event(EventKind.CONFIG_CHANGED)
    assert ch.data["new"][STEPS] == 2 and ch.data["old"][STEPS] == 3 and ch.data["source"] == "phase_stream"
    assert session.store.value(S.SPEC_NUM_STEPS) == 2
    # The server's refusal carries its reason; nothing changes.
    standin.refuse_next = "speculative_eagle_topk=4 needs num_draft_tokens > steps+1"
    res = session.set_config({TOPK: 4})
    assert not res.ok and "needs num_draft_tokens" in res.reason
    session.tick()
    assert session.store.last_event(EventKind.CONFIG_REFUSED).data["reason"] == res.reason
    # Unknown knobs are refused before anything is sent.
    n = len(standin.posts)
    assert not session.set_config({"max_running_requests": 3}).ok and len(standin.posts) == n


def test_sglang_with_plugin_sets_steps_through_its_key_and_reads_false_as_refusal(wire):
    sg = StandIn(kind="sglang", plugin=True, adaptive=True).start()
    try:
        b = SGLangBackend(sg.url)
        session, clock = wire(b)
        b.poll_server_info()
        assert b.plugin is not None and b.capabilities.can_set(STEPS)
        assert {"server_args": {"specdecode_timers": 60.0}} in sg.posts      # the timer lease
        assert not b.capabilities.can_set(TOPK)
        res = b.set_config({STEPS: 2})
        assert res.ok and sg.posts[-1] == {"server_args": {"specdecode_num_steps": 2}}
        sg.plugin = False          # the server now says [false] to our key
        res = b.set_config({STEPS: 4})
        assert not res.ok and res.reason == REFUSED_BY_SGLANG
        res = b.set_config({TOPK: 2})
        assert not res.ok and "relaunch" in res.reason
    finally:
        sg.stop()


def test_sglang_relaunched_server_is_asked_for_the_plugin_and_a_lease_at_once(wire):
    sg = StandIn(kind="sglang", plugin=False, adaptive=True).start()
    try:
        b = SGLangBackend(sg.url)
        session, clock = wire(b)
        b.poll_server_info()
        assert b.plugin is None and sg.posts == []
        # Relaunched (managed mode) with the plugin: a new startup_time, the same URL.
        sg.plugin, sg.startup_time = True, sg.startup_time + 30
        clock.advance(1.0)                                   # well inside a lease renewal period
        b.poll_server_info()
        assert b.plugin is not None and b.capabilities.can_set(STEPS)
        assert sg.posts == [{"server_args": {"specdecode_timers": 60.0}}]
        b.poll_server_info()
        assert len(sg.posts) == 1                            # the same server: renewed on its period
    finally:
        sg.stop()


def test_sglang_without_phase_stream_changes_come_from_read_back(wire):
    sg = StandIn(kind="sglang").start()
    try:
        b = SGLangBackend(sg.url)
        session, clock = wire(b)
        assert b.poll_phases() is False and b.phase_stream is False
        b.poll_server_info(); b.poll_metrics()
        sg.iterate([1, 2])
        sg.config["steps"] = 5          # e.g. SGLang's adaptive switched tiers
        clock.advance(0.5)
        b.poll_server_info(); b.poll_metrics()
        session.tick()
        ch = session.store.last_event(EventKind.CONFIG_CHANGED)
        assert ch.data["source"] == "server_info" and ch.data["new"][STEPS] == 5
        st = session.store
        assert st.value(S.SPEC_ACCEPT_LEN) == 2.5                       # SGLang's gauge
        assert st.value(S.phase_share_pct("draft")) == pytest.approx(100 * 0.003 / 0.5)
        assert st.value(S.SERVER_TOK_PER_S) == pytest.approx(5 / 0.5)
    finally:
        sg.stop()


@pytest.mark.parametrize("mode,needle", [("html", "HTML"), ("500", "HTTP 500"), ("garbage", "not")])
def test_bad_answers_are_poll_errors_once(standin, wire, mode, needle):
    b = RefEngineBackend(standin.url)
    session, clock = wire(b)
    b.poll_metrics()
    standin.mode = mode
    for _ in range(3):
        clock.advance(0.25)
        b.poll_metrics(); b.poll_server_info(); b.poll_phases()
    session.tick()
    errs = session.store.events(EventKind.POLL_ERROR)
    assert len(errs) == 3 and all(needle in e.data["error"] for e in errs)   # one per endpoint
    assert session.connection().connected
    standin.mode = "ok"
    clock.advance(0.25)
    b.poll_metrics()
    session.tick()
    assert not math.isnan(session.store.value(S.SERVER_RUNNING))


def test_disconnect_is_a_state_and_polling_resumes(wire):
    s = StandIn().start()
    port = s.port
    b = RefEngineBackend(s.url, timeout=1.0)
    session, clock = wire(b)
    b.poll_server_info(); b.poll_metrics(); b.poll_phases()
    s.iterate([1]); s.decode_tokens = 1000.0
    clock.advance(0.25); b.poll_metrics(); b.poll_phases()
    s.stop()
    clock.advance(1.0)
    for _ in range(3):
        b.poll_metrics(); b.poll_server_info(); b.poll_phases()
    session.tick()
    c = session.connection()
    assert not c.connected and c.since == clock.now() and "cannot connect" in c.error
    assert len(session.store.events(EventKind.DISCONNECTED)) == 1
    # The server comes back (restarted: counters and the phase sequence start again).
    s2 = StandIn()
    s2.start(port)
    try:
        clock.advance(4.0)
        b.poll_server_info(); b.poll_metrics(); b.poll_phases()
        s2.iterate([2]); s2.decode_tokens = 3.0
        clock.advance(0.25)
        b.poll_metrics(); b.poll_phases()
        session.tick()
        ev = session.store.last_event(EventKind.CONNECTED)
        assert ev.data["after_s"] == pytest.approx(4.0)
        assert session.connection().connected
        toks = session.store.window(S.SERVER_TOK_PER_S).v
        assert all(v >= 0 for v in toks) and toks[-1] == pytest.approx(3.0 / 0.25)
        assert session.store.value(S.SERVER_ITERATIONS) == 2
    finally:
        s2.stop()


def test_api_key_is_sent_and_its_absence_explained(wire):
    s = StandIn(api_key="sekret").start()
    try:
        with pytest.raises(ServerError, match="API key"):
            connect(s.url)
        b = connect(s.url, api_key="sekret")
        assert b.info["launch"]["api_key"] == "***"        # never stored or recorded
        session, clock = wire(b)
        assert b.set_config({STEPS: 1}).ok
    finally:
        s.stop()


def test_backlog_on_attach_is_skipped_not_reported_as_current(standin, wire):
    for i in range(2500):                       # more than two pages of history
        standin.iterate([1], t=1000.0 + i * 0.01)
    b = RefEngineBackend(standin.url)
    session, clock = wire(b)
    b.poll_phases()
    session.tick()
    assert b.phases.cursor == 2500 and session.store.series_names("phase/") == []
    standin.iterate([2])
    clock.advance(0.25)
    b.poll_phases()
    session.tick()
    assert session.store.value(S.SERVER_ITERATIONS) == 1


def test_started_session_knows_the_server_at_once_and_threads_stop(standin):
    import threading
    before = {t.name for t in threading.enumerate()}
    b = connect(standin.url)
    session = Session(b).start()
    session.tick()
    assert session.server_info()["kind"] == "refengine" and session.active_config()[STEPS] == 3
    assert any(t.name.startswith("refengine-") for t in threading.enumerate())
    session.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("refengine-") and t.name not in before]
