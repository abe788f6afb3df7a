"""Client conformance: request ids, abort reasons and concurrent control, against SGLang 0.5.23.

Rows state SGLang's rule with its file:line and check a real `serve --tp-size 2` over HTTP; after
each, the slot invariant (nothing in flight => nothing held, `GET /specdecode/slots`) must come
back clean. The last test races many `/set_internal_state` calls and checks /server_info against
what the ranks ran (the phase stream).
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import httpx
import pytest

from refengine.server.inputs import Sampling
from refengine.server.outputs import RequestOutput
from tests.conformance.serve_probe import PROMPT_IDS, generate, phase_records, set_state, wait_settled
from tests.server.helpers import MODEL_ARGS, checked_server

pytestmark = pytest.mark.slow

DUPLICATE = "Duplicate request ID detected: {}"


@pytest.fixture(scope="module")
def server():
    with checked_server([*MODEL_ARGS, "--tp-size", "2", "--port", "0", "--decode-log-interval", "0",
                         "--max-running-requests", "4", "--speculative-num-steps", "3"]) as s:
        yield s


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=180) as c:
        yield c
        wait_settled(c)   # every row leaves nothing held


def body(rid, n=8, batch=1):
    sp = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    if batch == 1:
        return {"input_ids": PROMPT_IDS, "rid": rid, "sampling_params": sp}
    return {"input_ids": [PROMPT_IDS] * batch, "rid": rid, "sampling_params": sp}


def refused(r: httpx.Response, rid: str) -> bool:
    return r.status_code == 400 and r.json()["error"]["message"] == DUPLICATE.format(rid)


# -- rows ------------------------------------------------------------------------------------------

def row_repeated_in_one_batch(http, base):
    r = http.post("/generate", json=body(["a1", "b1", "a1"], batch=3))
    assert refused(r, "a1"), r.text
    assert http.get("/specdecode/slots").json()["reserved_rids"] == []


def row_already_in_flight(http, base):
    with http.stream("POST", "/generate", json={**body("live1", n=400), "stream": True}) as s:
        next(line for line in s.iter_lines() if line.startswith("data: {"))   # it is running
        assert "live1" in http.get("/specdecode/slots").json()["in_flight"]
        assert refused(http.post("/generate", json=body("live1")), "live1")
        assert refused(http.post("/generate", json=body(["x2", "live1"], batch=2)), "live1")
    # Closing the stream cancelled it; once the engine ended it, the id is free again.
    wait_settled(http)
    assert http.post("/generate", json=body("live1")).status_code == 200


def row_reused_after_finish(http, base):
    for _ in range(3):
        r = http.post("/generate", json=body("again"))
        assert r.status_code == 200 and r.json()["meta_info"]["id"] == "again"


def row_racing_reuse(http, base):
    """The red-team reproduction: 8 concurrent batches repeating their id, then pairs of
    concurrent requests sharing one; before the fix these hung and leaked 7 of 8 slots."""
    def post(payload):
        with httpx.Client(base_url=base, timeout=180) as c:
            return c.post("/generate", json=payload)

    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(post, [body([f"r{i}", f"r{i}"], batch=2) for i in range(8)]))
        assert all(refused(r, f"r{i}") for i, r in enumerate(batches))
        pairs = list(pool.map(post, [body(f"p{i // 2}", n=24) for i in range(8)]))
    for i in range(0, 8, 2):
        a, b = pairs[i], pairs[i + 1]
        ok = [r for r in (a, b) if r.status_code == 200]
        # Both succeed only if one ended before the other arrived; a refusal is SGLang's 400.
        assert ok and all(r.status_code == 200 or refused(r, f"p{i // 2}") for r in (a, b)), (a.text, b.text)
        assert all(len(r.json()["output_ids"]) == 24 for r in ok)
    wait_settled(http)


def row_abort_reason_shape(http, base):
    """SGLang's FINISH_ABORT.to_json (schedule_batch.py 339-345) from the engine's reasons."""
    def out():
        return RequestOutput(rid="r", prompt_tokens=1, sampling=Sampling(), decode=lambda ids: "")
    gone = out()
    gone.add([], finished=True, reason="abort", message="client disconnected")
    assert gone.finish_reason == {"type": "abort", "message": "client disconnected", "status_code": None,
                                  "err_type": None}
    dead = out()
    dead.add([], finished=True, reason="error", message="TP rank 1 died")
    assert dead.finish_reason == {"type": "abort", "message": "TP rank 1 died", "status_code": 503,
                                  "err_type": "ServiceUnavailable"}
    plain = out()
    plain.add([], finished=True, reason="abort")
    assert plain.finish_reason["message"] == "Aborted"


@dataclass(frozen=True)
class Row:
    name: str
    rule: str
    check: Callable[[httpx.Client, str], None]


ROWS = [
    Row("repeated in one batch", "a rid repeated within one batch: 400 'Duplicate request ID detected: {rid}' "
                                 "before anything runs (tokenizer_manager.py 3833-3836)", row_repeated_in_one_batch),
    Row("already in flight", "a rid already in rid_to_state: the same 400 (tokenizer_manager.py 3833-3836)",
        row_already_in_flight),
    Row("reused after finish", "a finished request's rid leaves rid_to_state and may be reused "
                               "(tokenizer_manager.py 2774; 3638 is the abort path)", row_reused_after_finish),
    Row("racing reuse", "concurrent reuse: one runs, the others get the 400; no slot leaks", row_racing_reuse),
    Row("abort reason", "abort finish reasons carry message, status_code and err_type "
                        "(schedule_batch.py 339-345)", row_abort_reason_shape),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_row(http, server, row):
    row.check(http, server.url)


# -- concurrent /set_internal_state (red-team D2) ----------------------------------------------

FAMILIES = [[(1, "sharded"), (2, "replicated"), (3, "rank0")],
            [(4, "rank0"), (5, "sharded"), (2, "rank0")]]


def test_concurrent_config_changes_serialised(server, http):
    """Rounds of three concurrent changes under load, each round's configs distinct from each
    other and from the previous round's, so every change is a real one: each [true] gets its
    own epoch, every epoch the ranks ran carries one config, and every /server_info reading
    names the config the ranks ran under its epoch."""
    base = server.url
    start = http.get("/server_info").json()["internal_states"][0]["config_epoch"]
    seq = phase_records(http, 0)[0]
    stop = threading.Event()
    load_errors: list[str] = []

    def load() -> None:
        with httpx.Client(base_url=base, timeout=180) as c:
            while not stop.is_set():
                r = c.post("/generate", json=body(None, n=48))
                if r.status_code != 200:
                    load_errors.append(r.text)

    infos: list[tuple] = []

    def watch() -> None:
        with httpx.Client(base_url=base, timeout=180) as c:
            while not stop.is_set():
                st = c.get("/server_info").json()["internal_states"][0]
                infos.append((st["config_epoch"], st["speculative_num_steps"], st["speculative_draft_placement"]))

    def change(cfg: tuple[int, str]) -> int:
        with httpx.Client(base_url=base, timeout=180) as c:
            r = set_state(c, speculative_num_steps=cfg[0], speculative_draft_placement=cfg[1])
            assert r.status_code == 200 and r.json() == [True], r.text
            return r.status_code

    rounds = 8
    threads = [threading.Thread(target=load) for _ in range(2)] + [threading.Thread(target=watch)]
    for t in threads:
        t.start()
    try:
        with ThreadPoolExecutor(3) as pool:
            for family in itertools.islice(itertools.cycle(FAMILIES), rounds):
                assert list(pool.map(change, family)) == [200] * 3
        final = http.get("/server_info").json()["internal_states"][0]
        assert final["config_epoch"] == start + 3 * rounds, "every change must get its own epoch"
        # Keep the load on until the ranks ran an iteration under the final epoch.
        ran: dict[int, set] = {}
        while final["config_epoch"] not in ran:
            seq, recs = phase_records(http, seq)
            for r in recs:
                ran.setdefault(r["epoch"], set()).add((r["steps"], r["placement"]))
    finally:
        stop.set()
        for t in threads:
            t.join(180)
    assert not load_errors, load_errors[:2]
    assert all(len(v) == 1 for v in ran.values()), {e: v for e, v in ran.items() if len(v) > 1}
    assert ran[final["config_epoch"]] == {(final["speculative_num_steps"], final["speculative_draft_placement"])}
    checked = [(e, s, p) for e, s, p in infos if e in ran]
    assert len(checked) >= 10, "too few /server_info readings under an epoch the ranks ran"
    wrong = [(e, s, p) for e, s, p in checked if ran[e] != {(s, p)}]
    assert not wrong, f"/server_info named a setting the ranks were not running: {wrong[:5]}"
