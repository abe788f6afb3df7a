"""One paging rule for every reader of the phase stream (tuner.backends.phase_pages): checked pages,
the backlog on arrival and a restarted server's first page are history, the arrival is bounded."""

from __future__ import annotations

import pytest

from tuner.backends import phase_pages as P
from tuner.backends.derive import PhaseStreamReader


class Ring:
    """The server's paging rule over `n` records (the pure logic's stand-in for the endpoint)."""

    def __init__(self, n: int) -> None:
        self.seqs = list(range(1, n + 1))
        self.asked: list[int] = []

    def fetch(self, after: int) -> dict:
        self.asked.append(after)
        recs = [{"seq": s} for s in self.seqs if s > after][:P.PAGE_LIMIT]
        newest = self.seqs[-1] if self.seqs else 0
        return {"next": recs[-1]["seq"] if recs else min(after, newest), "dropped": 0, "records": recs}


def test_arrival_pages_through_the_backlog_as_history():
    ring = Ring(2500)
    pages, history = P.read(ring.fetch, None)
    assert history and ring.asked == [0, 1024, 2048] and pages[-1].next == 2500
    ring.seqs += [2501, 2502]
    pages, history = P.read(ring.fetch, 2500)
    assert not history and [r["seq"] for r in pages[0].records] == [2501, 2502]


def test_arrival_is_bounded_against_a_server_that_never_ends():
    # The tuner's feed used to page for as long as the server answered full pages.
    endless = lambda after: {"next": after + P.PAGE_LIMIT, "records": [{"seq": 0}] * P.PAGE_LIMIT}
    pages, history = P.read(endless, None)
    assert history and len(pages) == 1 + P.MAX_HISTORY_PAGES


def test_a_restarted_server_is_history():
    ring = Ring(3)
    pages, history = P.read(ring.fetch, 500)      # our cursor is beyond its newest: it began again
    assert history and pages[0].next == 3


@pytest.mark.parametrize("raw, why", [
    ([], "not a phase page"), ({"next": 3}, "not a phase page"), ({"records": {}, "next": 3}, "not a phase page"),
    ({"records": [], "next": "3"}, "not a sequence number"), ({"records": [], "next": True}, "not a sequence number"),
])
def test_a_bad_page_is_a_one_line_value_error(raw, why):
    with pytest.raises(ValueError) as e:
        P.phase_page(raw)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_bad_dropped_count_reads_as_none_dropped():
    # The tuner's feed did int(page["dropped"]): a hostile "x" raised in its thread and ended it.
    page = P.phase_page({"records": [{"seq": 1}, "junk"], "next": 1, "dropped": "x"})
    assert page.dropped == 0 and page.records == [{"seq": 1}]


def test_the_backend_reader_takes_the_same_pages():
    r = PhaseStreamReader()
    with pytest.raises(ValueError, match="not a sequence number"):
        r.update(0.0, {"records": [], "next": "7"})   # it used to read "7" as 7
    r.update(0.0, P.PhasePage([], 7), history=True)
    assert r.cursor == 7
