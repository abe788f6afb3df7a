"""Prefill is its own phase in the real server's phase stream (`serve --tp-size 2` on CPU): the
record of the iteration after an admission carries the admitted requests' prefill time, with its
collectives, and every other record carries 0; the phases still add up to the wall.

Asserts on what the server recorded: which records follow an admission is read from the records'
own batch sizes, never from the clock.
"""

from __future__ import annotations

import threading

import pytest

from harness import wait_until

pytestmark = pytest.mark.slow

PROMPT_IDS = list(b"import os\nimport sys\n\n\ndef main(")


def _page(http, after: int) -> dict:
    return http.get("/specdecode/phases", params={"after": after, "limit": 4096}).json()


def _generate(http, n: int, out: list) -> None:
    r = http.post("/generate", json={"input_ids": PROMPT_IDS, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    out.append(r.status_code)


def test_records_carry_prefill_in_the_iteration_after_an_admission(http):
    # On an idle server the first record after the cursor is A's first iteration (asserted below).
    cursor = _page(http, 0)["next"]
    codes: list = []
    a = threading.Thread(target=_generate, args=(http, 400, codes))
    a.start()
    # A is running (a record of batch 1 exists); now B is admitted while A decodes.
    wait_until(lambda: _page(http, cursor)["records"], 120, "request A's first iteration")
    _generate(http, 8, codes)
    a.join(300)
    assert codes == [200, 200]
    recs = _page(http, cursor)["records"]
    bs = [r["bs"] for r in recs]
    assert bs[0] == 1 and 2 in bs, bs           # B was admitted while A ran, then left
    joined = bs.index(2)
    assert bs[:joined] == [1] * joined and set(bs[joined:]) <= {1, 2}
    for i, r in enumerate(recs):
        after_admission = i in (0, joined)
        pre, calls = r["phase_ms"]["prefill"], r["comm_calls"]["prefill"]
        assert (pre > 0) == after_admission, (i, bs[i], pre)
        # TP 2: the target's prefill all-reduces, labelled prefill, and timed (no graphs on CPU).
        assert (calls > 0) == after_admission and (r["comm_ms"]["prefill"] > 0) == after_admission, (i, r)
        assert r["comm_ms"]["prefill"] <= pre
        # `wall_ms` still covers everything and `other` is the rest: prefill is not in it twice.
        assert sum(r["phase_ms"].values()) == pytest.approx(r["wall_ms"], rel=1e-9, abs=1e-9), r
