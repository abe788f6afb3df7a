"""What the fleet lays over its rows: the last trace capture's draft-collective share with its age
(a real analysis of the SGLang-shaped GPU trace fixture, saved and read back as capture.py does),
`once`'s line for it, the poller applying its overlays to rows of a server nobody answers for, and
a row degraded before its first answer counted as one Prometheus alone reaches."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import free_port, wait_until
from probes.trace_analysis import analyze_paths
from tuner.commands.once_readout import format_table, trace_share
from tuner.core import trace_share as T
from tuner.core.records import Trace
from tuner.core.session import Session
from tuner.fleet.members import Member
from tuner.fleet.overlays import Refreshing
from tuner.fleet.poller import FleetPoller
from tuner.fleet.prom_overlay import PrometheusOverlay
from tuner.fleet.prometheus import Target
from tuner.fleet.rows import FleetRow, row_cells
from tuner.fleet.trace_overlay import TraceShareOverlay

SGLANG_GPU = sorted((Path(__file__).parents[1] / "probes" / "fixtures" / "sglang_gpu").glob("*.trace.json.gz"))


@pytest.fixture(scope="module")
def analysis() -> dict:
    return analyze_paths(SGLANG_GPU).to_dict()


def test_draft_comm_share_of_a_real_sglang_trace_analysis(analysis):
    # Rank 0's mean iteration (worked out by hand in tests/probes/test_trace_analysis.py): draft
    # collectives 0.03 ms + draft-extend 0.01 ms over a 0.925 ms wall.
    assert T.draft_comm_pct(analysis) == pytest.approx(100 * 0.04 / 0.925, rel=1e-3)
    assert T.draft_comm_pct({"ranks": []}) is None and T.draft_comm_pct({"nonsense": 1}) is None
    assert [T.age_text(s) for s in (5, 240, 7200, 3 * 86400)] == ["5 s", "4 min", "2 h", "3 d"]


def test_saved_shares_newest_per_server_password_free_and_junk_skipped(analysis, tmp_path):
    url = "http://user:secret@10.0.0.1:30000"
    for name, at in (("old", 1000.0), ("new", 2000.0)):
        (tmp_path / name).mkdir()
        assert T.save(tmp_path / name, url, analysis, at, name)
    (tmp_path / "other").mkdir()
    assert T.save(tmp_path / "other", "http://10.0.0.2:30000", analysis, 3000.0)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / T.FILE).write_text("{not json")
    (tmp_path / "empty").mkdir()
    assert not T.save(tmp_path / "empty", url, {"ranks": []}, 4000.0)     # no share: nothing written
    assert all("secret" not in p.read_text() for p in tmp_path.glob(f"*/{T.FILE}"))
    got = T.newest_saved(url, tmp_path)
    assert got is not None and got.trace_id == "new" and got.at == 2000.0
    assert T.newest_saved("http://10.0.0.3:30000", tmp_path) is None
    assert T.newest_saved(url, tmp_path / "missing") is None


def test_fleet_row_and_once_show_the_trace_share_with_its_age(analysis, tmp_path):
    m = Member("east", "http://10.0.0.1:30000")
    (tmp_path / "cap").mkdir()
    T.save(tmp_path / "cap", m.url, analysis, 1000.0)
    overlay = TraceShareOverlay([m], tmp_path, clock=lambda: 1240.0)
    overlay.refresh()
    live, sglang = FleetRow("east", m.url, draft_comm_pct=12.0), FleetRow("east", m.url)
    assert overlay.fill([live], [m])[0] == live                           # a live split is never replaced
    row = overlay.fill([sglang], [m])[0]
    assert row_cells(row)[5] == "4 % (trace 4 min ago)" and row_cells(live)[5] == "12 %"
    assert row.to_json()["draft_comm_trace_age_s"] == 240.0

    # once on one server: this session's own capture first (Trace records carry rank 0's analysis).
    s = Session(None)
    assert trace_share(s) is None
    s.put(Trace(s.now() - 60, "cap-1", 0, "x-TP-0.trace.json.gz", b"", analysis))
    s.tick()
    d = trace_share(s)
    assert d["trace_id"] == "cap-1" and d["pct"] == pytest.approx(4.324, abs=1e-3) and 59 < d["age_s"] < 600
    r = {"server": {}, "active": {}, "url": "", "connection": "", "tok_per_s": None, "client_tok_per_s": None,
         "iter_per_s": None, "batch_size": None, "accept_len": None, "accept_rate": None, "accept_pos": {},
         "phase_ms": {}, "phase_comm_ms": {}, "phase_share_pct": {}, "live": {}, "problems": [],
         "draft_comm_trace": {"pct": 31.2, "age_s": 240.0, "trace_id": "x"}}
    assert "draft coll. 31 % (trace 4 min ago)" in format_table(r).splitlines()


def test_poller_lays_its_overlays_over_a_server_nobody_answers_for(analysis, tmp_path):
    m = Member("down", f"http://127.0.0.1:{free_port()}")      # refused: the row is gone
    (tmp_path / "cap").mkdir()
    T.save(tmp_path / "cap", m.url, analysis, 1000.0)
    overlay = Refreshing(TraceShareOverlay([m], tmp_path, clock=lambda: 1030.0), every_s=60)
    with FleetPoller([m], overlays=[overlay], retry_s=60) as poller:
        row = wait_until(lambda: next((r for r in poller.rows() if r.state == "gone"), None), 30, "the row gone")
        assert row_cells(row)[5] == "4 % (trace 30 s ago)" and poller.notes() == []
    assert overlay._thread is not None and not overlay._thread.is_alive()


def test_a_row_degraded_before_any_answer_is_shown_from_prometheus():
    m = Member("far", "http://10.9.9.9:30000", source="prometheus", labels={"instance": "10.9.9.9:30000"})
    overlay = PrometheusOverlay(client=None, clock=lambda: 100.0)
    overlay.targets = {"10.9.9.9:30000": Target("http://10.9.9.9:30000/metrics", {"instance": "10.9.9.9:30000"},
                                                 "up", "", 99.5, 1.0, 1.0)}
    waiting = FleetRow("far", m.url, state="degraded", detail="no answer for 1.6 s")
    assert overlay.fill([waiting], [m])[0].state_text == "degraded (only through Prometheus (no answer for 1.6 s))"
    answered = FleetRow("far", m.url, state="degraded", detail="slow", kind="sglang")
    assert overlay.fill([answered], [m])[0] == answered          # it answered us once: its own state stands
    overlay.targets["10.9.9.9:30000"] = Target("http://10.9.9.9:30000/metrics", {}, "up", "", 97.0, 1.0, 1.0)
    assert overlay.fill([waiting], [m])[0].state_text.startswith("gone (Prometheus: last scrape 3.0 s ago")


def test_a_capture_saves_its_share_for_later_commands(tmp_path):
    """capture_into over real HTTP from the SGLang-shaped stand-in of tests/probes/test_capture.py:
    the capture's folder holds capture.json, which the next command finds by the server's URL."""
    from tests.probes.test_capture import ContractServer
    from tuner.core.capture import capture_into

    class _Session:          # what capture_into uses of a Session (as tests/core/test_capture_bad_trace.py)
        def __init__(self, url: str) -> None:
            self.backend = type("B", (), {"url": url, "api_key": None})()

        def now(self) -> float:
            return 1.0

        def put(self, record) -> None:
            pass

    (tmp_path / "srv").mkdir()
    srv = ContractServer(tmp_path / "srv")
    try:
        got = capture_into(_Session(srv.url), num_steps=2, timeout_s=30, keep_in=tmp_path / "kept")
    finally:
        srv.close()
    saved = T.newest_saved(srv.url, tmp_path / "kept")
    assert got.analysis is not None and saved is not None and saved.trace_id == got.trace_id
    assert saved.pct == pytest.approx(T.draft_comm_pct(got.analysis), abs=1e-3) and saved.pct > 0


def test_a_leaders_gpu_column_covers_its_follower_nodes_gpus():
    """Each node's ranks are in its own /metrics, so its GPUs join to its own scrape instance; the
    leader's row shows the mean over every node's (dcgm.join of dcgm-exporter-shaped series)."""
    from tuner.fleet import dcgm

    def gpu(host, bus, util):
        return {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": host, "pci_bus_id": bus, "gpu": "0"}, util

    def rank(inst, host, r, bus):
        return {"__name__": dcgm.RANK_INFO, "instance": inst, "host": host, "tp_rank": str(r), "pci_bus_id": bus}, 1.0
    series = [gpu("n0", "00000000:18:00.0", 80.0), gpu("n1", "00000000:18:00.0", 40.0),
              rank("n0:30000", "n0", 0, "00000000:18:00.0"), rank("n1:30001", "n1", 1, "00000000:18:00.0")]
    lead = Member("n0:30000", "http://n0:30000", source="prometheus",
                  labels={"instance": "n0:30000", "followers": "n1:30001", "follower_instances": "n1:30001"})
    overlay = PrometheusOverlay(client=None)
    overlay.gpus = dcgm.join(series)
    assert overlay.fill([FleetRow(lead.name, lead.url, state="connected", kind="sglang")], [lead])[0].gpu_pct == 60.0
