"""A recording with acceptance buckets, replayed in the TUI: the per-position panel lists p_k per
batch-size and context bucket, counted from the recording (phase records through the real reader
and Recorder; the replay and the app are the real ones)."""

from __future__ import annotations

import asyncio
import random

from rich.console import Console

from tuner.app import make_app
from tuner.backends.derive import PhaseStreamReader
from tuner.commands.replay import open_replay
from tuner.core.records import Event
from tuner.recording import Recorder
from tuner.widgets.acceptance import PositionBars

from .scenarios import SIZE

CHAIN = {"speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3,
         "speculative_draft_placement": "sharded"}


def _recording(path) -> None:
    rnd = random.Random(3)
    info = {"kind": "refengine", "version": "0.1.0", "model": "tiny", "tp_size": 1, "launch": dict(CHAIN),
            "active": dict(CHAIN)}
    rec = Recorder(path, {"backend": "refengine", "url": "http://127.0.0.1:1", "server_info": info,
                          "active": dict(CHAIN), "launch": dict(CHAIN), "command": "test"})
    reader = PhaseStreamReader()
    t0 = 2_000_000_000.0
    out = [Event(t0, "server_info", info)]
    reader.update(t0, {"next": 0, "dropped": 0, "records": []})
    for i in range(60):      # one page per half second: 2 records of batch 9 (short contexts) and 1
        recs = [{"seq": 3 * i + j + 1, "t": 100.0 + i / 2 + j / 10, "epoch": 1, "steps": 2, "topk": 1,
                 "num_draft_tokens": 3, "placement": "sharded", "bs": bs, "wall_ms": 5.0, "phase_ms": {"verify": 4.0},
                 "accepted": [rnd.choice([0, 1, 2]) for _ in range(bs)], "ctx": [rnd.randint(300, 400)] * bs}
                for j, bs in enumerate((9, 9, 1))]
        s, e = reader.update(t0 + 1 + i / 2, {"next": recs[-1]["seq"], "dropped": 0, "records": recs})
        out += s + e
    rec.write(out)
    rec.close()


def test_the_replayed_panel_shows_acceptance_by_bucket(tmp_path):
    _recording(tmp_path / "rec.db")

    async def scenario():
        session = open_replay(tmp_path / "rec.db", start=20.0, paused=True)
        app = make_app(session, tick_s=None)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("full_stop")
            await pilot.pause()
            bars = app.main.query_one("#positions", PositionBars)
            ranges = [b[0] for b in bars._view.buckets]
            assert ranges == ["batch 1", "batch 8–15", "context 256–511"]
            console = Console(width=60, record=True)
            console.print(bars.render())
            text = console.export_text()
            assert "p_k by bucket" in text and "batch 8–15" in text
            # In a narrow panel a bucket stays on one line: a wrapped "n=…" read as the next bucket.
            narrow = Console(width=30, record=True)
            narrow.print(bars.render())
            lines = narrow.export_text().splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith("p_k by bucket"))
            assert [line.split()[0] for line in lines[at + 1:] if line.strip()] == ["batch", "batch", "context"]
    asyncio.run(scenario())
