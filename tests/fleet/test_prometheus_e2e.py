"""The fleet through a real Prometheus (Debian's binary, a generated config, a free port, 1-s scrapes)
scraping the shared session `serve --tp-size 2` and the DCGM stand-in: discovery by selector, the
phase split and the DCGM join from one query each, `once --prometheus` and `report --prometheus`,
and the fleet screen's poller with attach's overlays: a target only Prometheus reaches degraded, then
gone from its first failed scrape."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness import ROOT, free_port, wait_until
from prom_harness import BINARY, running_prometheus
import dcgm_standin
from tuner.fleet import dcgm, prom_phases
from tuner.fleet.members import Member
from tuner.fleet.overlays import for_fleet
from tuner.fleet.poller import FleetPoller
from tuner.fleet.prometheus import PrometheusClient, discover_fleet

# Skipped only off CI: .ci/run installs the package and fails when it cannot.
pytestmark = pytest.mark.skipif(not Path(BINARY).exists() and not os.environ.get("CI"),
                                reason="needs Debian's prometheus (apt-get install --no-install-recommends prometheus)")


def _load(url: str, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stop.is_set():
            http.post("/generate", json={"input_ids": [1, 2, 3, 4, 5, 6], "sampling_params": {
                "max_new_tokens": 16, "temperature": 0, "ignore_eos": True}})


def test_fleet_through_prometheus_and_dcgm(tp2_server, tmp_path):
    serve = tp2_server.url.split("://", 1)[1]
    host = socket.gethostname()
    dport, exporter = dcgm_standin.start(host, gpus=2, bad=True)
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(tp2_server.url, stop), daemon=True)
    try:
        with running_prometheus(tmp_path, {"sglang": [serve], "dcgm": [f"127.0.0.1:{dport}"]}) as url:
            client = PrometheusClient(url)
            loader.start()
            wait_until(lambda: all(t.last_scrape for t in client.targets()) and len(client.targets()) == 2, 60,
                       "Prometheus to scrape both targets once", interval=0.2)
            # Discovery: the selector picks the server; its URL is the scrape URL minus /metrics.
            g = discover_fleet(url, '{job="sglang"}')
            assert [(m.url, m.source) for m in g.members] == [(tp2_server.url, "prometheus")] and g.notes == []
            # The exporter answers /metrics but not /server_info: a follower without a leader, not a server.
            g = discover_fleet(url, '{job="dcgm"}')
            assert g.members == [] and len(g.notes) == 1 and "follower node" in g.notes[0]

            # The phase split, from one query over the engine's counters (collectives included).
            def split():
                s = prom_phases.split(client.query(prom_phases.query("10s"))).get(serve)
                return s if s is not None and s.draft_comm_pct is not None and s.phase_ms.get("verify") else None
            s = wait_until(split, 120, "the engine's phase counters to have a rate in Prometheus", interval=0.5)
            assert s.iter_per_s > 0 and 0 < s.draft_comm_pct < 100 and s.comm_ms["draft"] <= s.phase_ms["draft"]

            # DCGM: one query answers every GPU and every rank; on CPU the server's ranks have no bus id,
            # so nothing joins, the stand-in's GPUs are unjoined and the label-less one is one line.
            def answered():
                got = client.query(dcgm.QUERY)
                return got if {lab.get("__name__") for lab, _ in got} >= {*dcgm.FIELDS} - {"DCGM_FI_PROF_SM_ACTIVE"} \
                    | {dcgm.NVLINK_RATE, dcgm.RANK_INFO} else None
            got = wait_until(answered, 60, "DCGM's series and the NVLink rate", interval=0.5)
            j = dcgm.join(got)
            assert j.by_server == {} and sorted(j.unjoined) == [f"{host} 0000:18:00.0", f"{host} 0000:19:00.0"]
            assert j.problems == ["DCGM: 7 series without a Hostname label were left out (cannot join them to a server)"]
            # The same real series joined to a rank that runs on GPU 1 of that host.
            rank = ({"__name__": dcgm.RANK_INFO, "instance": serve, "host": host, "tp_rank": "1",
                     "pci_bus_id": "0000:19:00.0"}, 1.0)
            gpu1 = dcgm.join(got + [rank]).by_server[serve][1]
            assert gpu1["util_pct"] == 50.0 and gpu1["gr_active_pct"] == pytest.approx(60.0)
            assert gpu1["power_w"] == 301.0 and gpu1["mem_used_mib"] == 70001.0 and gpu1["pcie_rx_mbps"] == 3.0
            assert gpu1["nvlink_total_per_s"] > 0

            # `once --prometheus`: the server found through Prometheus, its row connected.
            done = subprocess.run([sys.executable, "-c", "import sys; from tuner.cli import main; sys.exit(main())", "once", "--prometheus", url, "--selector",
                                   '{job="sglang"}', "--seconds", "1", "--json"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            rows = json.loads(done.stdout)["servers"]
            assert [(r["url"], r["state"]) for r in rows] == [(tp2_server.url, "connected")]

            # `report --prometheus`: the same report builder over Prometheus' range of the server.
            from tuner.cli import main
            out = tmp_path / "report.json"
            assert main(["report", "--prometheus", url, "--selector", f'{{instance="{serve}"}}',
                         "--from", "now-5m", "--to", "now", "--out", str(out)]) == 0
            rep = json.loads(out.read_text())
            assert any((r["server_tok_per_s"] or 0) > 0 and r["phase_ms"].get("verify", 0) > 0 for r in rep["settings"])
            assert main(["report", "--prometheus", url, "--selector", '{instance="nowhere:1"}', "--from", "now-5m",
                         "--out", str(tmp_path / "r2.json")]) == 1 and not (tmp_path / "r2.json").exists()

            # The fleet screen's poller with attach's overlays (Prometheus refreshed on its own thread):
            # the server, and a target only Prometheus reaches (our own connection is refused, its scrape
            # target answers): degraded while it answers, gone from its first failed scrape.
            far = Member("far", f"http://127.0.0.1:{free_port()}", source="prometheus",
                         labels={"instance": f"127.0.0.1:{dport}"})
            near = Member("serve", tp2_server.url, source="prometheus", labels={"instance": serve})
            with FleetPoller([near, far], overlays=for_fleet([near, far], url)) as poller:
                def row(name, ok):
                    r = {r.name: r for r in poller.rows()}[name]
                    return r if ok(r) else None
                near_row = wait_until(lambda: row("serve", lambda r: r.state == "connected" and r.draft_comm_pct),
                                      60, "the server's row with its live draft-collective share")
                assert near_row.draft_comm_trace_age_s is None and poller.notes() == [
                    "DCGM: 7 series without a Hostname label were left out (cannot join them to a server)"]
                wait_until(lambda: row("far", lambda r: r.state_text.startswith(
                    "degraded (only through Prometheus (")), 30, "the far target degraded, seen through Prometheus")
                exporter.shutdown()
                exporter.server_close()
                t_stop = time.time()
                gone = wait_until(lambda: row("far", lambda r: r.state == "gone" and r.detail.startswith("Prometheus:")),
                                  30, "the stopped exporter to show gone in the fleet's rows", interval=0.2)
                target = poller.overlays[0].overlay.targets[f"127.0.0.1:{dport}"]
            assert gone.detail.startswith("Prometheus: ") and target.health == "down"
            assert target.last_scrape - t_stop <= target.interval_s + target.timeout_s
            client.close()
    finally:
        stop.set()
        exporter.shutdown()
        loader.join(120) if loader.is_alive() else None
