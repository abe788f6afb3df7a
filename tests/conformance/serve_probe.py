"""What the conformance tests read from a real `serve` over HTTP: the phase stream, the slot
invariant (`GET /specdecode/slots`), counters in /metrics, and a greedy /generate.

Helpers only (no fixtures, no assertions about SGLang's rules): the rules live in the test tables.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.harness import wait_until
from prometheus_client.parser import text_string_to_metric_families

# Python source: what the shipped tiny model was trained on, so its drafts get accepted.
PROMPT_IDS = list(b"import os\nimport sys\n\n\ndef main(")
SETTLE_S = 60.0


def generate(http: httpx.Client, n: int, ids: list[int] = PROMPT_IDS, **sampling: Any) -> dict:
    """One greedy /generate reply (ignore_eos unless given)."""
    sp = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **sampling}
    r = http.post("/generate", json={"input_ids": ids, "sampling_params": sp})
    assert r.status_code == 200, r.text
    return r.json()


def set_state(http: httpx.Client, **args: Any) -> httpx.Response:
    return http.post("/set_internal_state", json={"server_args": args})


def phase_records(http: httpx.Client, after: int) -> tuple[int, list[dict]]:
    """Every record with seq > after, and the seq to read after next."""
    out: list[dict] = []
    while True:
        page = http.get("/specdecode/phases", params={"after": after, "limit": 4096}).json()
        out += page["records"]
        if not page["records"]:
            return page["next"], out
        after = page["next"]


def wait_settled(http: httpx.Client, timeout: float = SETTLE_S) -> dict:
    """Wait until nothing is held by the server (the slot invariant's clean state) and return the
    last /specdecode/slots reading; a leak shows as a timeout naming what stayed held."""
    last: dict = {}

    def clean():
        last.update(http.get("/specdecode/slots").json())
        held = last["running"] or last["waiting"] or last["reserved_rids"] or last["engine_requests"]
        return dict(last) if not held and not last["problems"] else None
    try:
        return wait_until(clean, timeout, "the server to hold no slot")
    except AssertionError:
        raise AssertionError(f"slots still held {timeout:.0f} s after the requests ended: {last}") from None


def newest_seq(http: httpx.Client) -> int:
    """The phase stream's newest seq once the engine has settled (no record of an earlier
    request can arrive after this)."""
    wait_settled(http)
    return phase_records(http, 0)[0]


def counter(http: httpx.Client, name: str) -> float:
    """Sum of a counter's samples (all label sets) in /metrics."""
    total = 0.0
    for fam in text_string_to_metric_families(http.get("/metrics").text):
        for s in fam.samples:
            if s.name == name:
                total += s.value
    return total
