"""The report's "What this server lets you change" section: the same lines the TUI's capture
analysis and `once` print (tuner.tuning.comm_whatif.remedies_for), from the recording's server info,
its newest analysed capture and the mean running batch. Pure: reads RecordingData only.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.core import series as S
from tuner.report.data import RecordingData
from tuner.tuning.comm_whatif import PCIE_IPC_ENV, pcie_ipc_offer, remedies_for

TITLE = "What this server lets you change"


def remedies_of(data: RecordingData) -> list[str]:
    info = data.server_info()
    analysis: Any = None
    for tr in data.traces():
        if tr.analysis:
            analysis = tr.analysis                   # the newest analysed capture wins
    batch = [v for v in data.get(S.SERVER_BATCH).v if math.isfinite(v)]
    caps = info.get("capabilities") or {}
    pinnable = (caps.get("live_values") or {}).get("speculative_num_steps")
    lines = remedies_for(info, analysis, sum(batch) / len(batch) if batch else None, pinnable)
    if pcie_ipc_offer(info):
        lines.append(f"the plugin reported NCCL on a PCIe-only TP group: relaunch with {PCIE_IPC_ENV}=1 in the "
                     f"server's environment, or `specdecode-tune launch --try {PCIE_IPC_ENV}=1 -- …`")
    return lines
