"""The bus: a thread-safe queue of immutable records from producers to the session.

Any thread may put; only the session drains (Session.tick). The bus never inspects, merges or drops
records, so what the store and the recorder see is exactly what producers said.
"""

from __future__ import annotations

import queue
from typing import Iterable

from tuner.core.records import Record


class Bus:
    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Record] = queue.SimpleQueue()

    def put(self, record: Record) -> None:
        self._q.put(record)

    def put_many(self, records: Iterable[Record]) -> None:
        for r in records:
            self._q.put(r)

    def drain(self, limit: int | None = None) -> list[Record]:
        """Take what is queued now (at most `limit`), in the order it was put."""
        out: list[Record] = []
        while limit is None or len(out) < limit:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                break
        return out

    def __len__(self) -> int:
        return self._q.qsize()
