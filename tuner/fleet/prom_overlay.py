"""What Prometheus adds to the fleet's rows: GPU readings from DCGM, the phase split where a
server's phase stream is not reachable, and the state of a server seen only through Prometheus.

`PrometheusOverlay(client).refresh()` asks three things (targets, the one DCGM query, the one phase
query) and keeps the answers; `fill(rows, members)` (pure over those answers) returns the rows with
`gpu_pct` (over a leader's GPUs and its follower nodes') and `draft_comm_pct` filled where the row
has none, and a row the tool cannot reach itself (gone, connecting, or degraded before any answer)
shown from Prometheus' side: degraded "only through Prometheus" while its target is up, gone with
Prometheus' reason once a scrape failed or one interval plus its timeout passed.
A refresh that fails keeps nothing old: its one line is `problem`. Must not contact a server.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from tuner.fleet import dcgm, prom_phases
from tuner.fleet.followers import FOLLOWER_INSTANCES
from tuner.fleet.members import Member
from tuner.fleet.prometheus import PrometheusError, Target, target_state
from tuner.fleet.rows import FleetRow

UNREACHED = ("gone", "connecting")


class PrometheusOverlay:
    def __init__(self, client: Any, clock: Callable[[], float] = time.time, window: str = "30s") -> None:
        self.client, self.clock, self.window = client, clock, window
        self.targets: dict[str, Target] = {}
        self.gpus = dcgm.GpuJoin()
        self.phases: dict[str, prom_phases.PhaseSplit] = {}
        self.problem = ""

    def refresh(self) -> None:
        try:
            self.targets = {t.instance: t for t in self.client.targets()}
            self.gpus = dcgm.join(self.client.query(dcgm.QUERY))
            self.phases = prom_phases.split(self.client.query(prom_phases.query(self.window)))
            self.problem = ""
        except PrometheusError as e:
            self.targets, self.gpus, self.phases, self.problem = {}, dcgm.GpuJoin(), {}, str(e)

    def notes(self) -> list[str]:
        return ([self.problem] if self.problem else []) + list(self.gpus.problems)

    def fill(self, rows: list[FleetRow], members: list[Member]) -> list[FleetRow]:
        instance = {m.name: m.labels.get("instance", "") for m in members}
        followers = {m.name: tuple(i for i in m.labels.get(FOLLOWER_INSTANCES, "").split(",") if i) for m in members}
        now = self.clock()
        out = []
        for r in rows:
            inst = instance.get(r.name, "")
            if not inst:
                out.append(r)
                continue
            if r.gpu_pct is None:
                r = replace(r, gpu_pct=self.gpus.util_pct(inst, also=followers.get(r.name, ())))
            split = self.phases.get(inst)
            if r.draft_comm_pct is None and split is not None:
                r = replace(r, draft_comm_pct=split.draft_comm_pct)
            target = self.targets.get(inst)
            # Never reached by us: gone, connecting, or degraded before its first answer (a connect
            # that timed out, or a row aged while its connect still waits) has no server kind yet.
            unreached = r.state in UNREACHED or (r.state == "degraded" and not r.kind)
            if unreached and target is not None:
                state, why = target_state(target, now)
                if state == "connected":
                    r = replace(r, state="degraded", detail=f"only through Prometheus ({r.detail or r.state})")
                elif state == "gone":
                    r = replace(r, state="gone", detail=why)
            out.append(r)
        return out
