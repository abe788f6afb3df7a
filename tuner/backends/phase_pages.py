"""Reading GET /specdecode/phases: one cursor protocol, and one reading of a record's setting, for
every reader of the phase stream.

The stream is built for several readers, each with its own cursor: the session's backend (per-poll
aggregates for the panels, tuner.backends.derive) and the tuner's feed (every iteration for the cost
model, tuner.tuning.phase_feed). Both read it the same way, here: a page is checked before use, the
backlog a server holds when a reader first arrives is history (paged through to the newest record,
never reported as current), and a `next` that goes back means the server restarted, so that page
is history too; and a record's knobs are read here, under their server-arg names. How strictly the
rest of a record is read is the reader's business (the panels take what is there, the tuner refuses
a malformed record). Does no I/O itself (the caller's `fetch` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tuner.core import setting as vocab

PAGE_LIMIT = 1024
MAX_HISTORY_PAGES = 16      # bounds the paging on arrival (a server's ring holds a few pages)


@dataclass(frozen=True)
class PhasePage:
    records: list[Mapping[str, Any]]
    """The page's records that are objects, in stream order (anything else is left out)."""
    next: int
    """The cursor to ask after next time."""
    dropped: int = 0
    """Records the server dropped before this reader saw them."""


def phase_page(raw: Any) -> PhasePage:
    """A checked page; ValueError (one line) when the answer is not a phase page."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("records"), list) or "next" not in raw:
        raise ValueError("/specdecode/phases answered something that is not a phase page")
    nxt = raw["next"]
    if isinstance(nxt, bool) or not isinstance(nxt, int):
        raise ValueError(f"/specdecode/phases: 'next' is not a sequence number: {nxt!r:.40}")
    dropped = raw.get("dropped") or 0
    dropped = dropped if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped > 0 else 0
    return PhasePage([r for r in raw["records"] if isinstance(r, Mapping)], nxt, dropped)


def restarted(cursor: int | None, page: PhasePage) -> bool:
    """The server's sequence began again (its `next` went back): the page is a new server's history."""
    return cursor is not None and page.next < cursor


def read(fetch: Callable[[int], Any], cursor: int | None) -> tuple[list[PhasePage], bool]:
    """(the pages of one poll, whether they are history). With a cursor: one page after it. Without
    (a reader's first poll): the server's backlog from the start, paged through to its newest record
    (at most MAX_HISTORY_PAGES more pages), all of it history. `fetch(after)` returns the raw
    answer to `GET /specdecode/phases?after=...&limit=PAGE_LIMIT`; its errors pass through."""
    if cursor is not None:
        page = phase_page(fetch(cursor))
        return [page], restarted(cursor, page)
    pages = [phase_page(fetch(0))]
    for _ in range(MAX_HISTORY_PAGES):
        if len(pages[-1].records) < PAGE_LIMIT:
            break
        pages.append(phase_page(fetch(pages[-1].next)))
    return pages, True


def record_knobs() -> dict[str, str]:
    """Server-arg name -> the phase record's key for the same knob (the knob table's rows)."""
    return {k.arg: k.key for k in vocab.KNOBS}


def record_config(record: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs a phase record ran with, under their server-arg names (None where it says nothing)."""
    return vocab.from_record(record)
