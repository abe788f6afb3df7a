"""The latency panel: what tuner.widgets.views.latency_view makes of a real Store's events (the load
driver's exact percentiles beside the server's p99 bucket, one line for each missing source, hidden
without any latency event), and the panel on the main screen of an app attached to the real engine
under a --rate load."""

from __future__ import annotations

import asyncio

import pytest

from tuner.core import latency as L
from tuner.core.events import EventKind
from tuner.core.records import Event
from tuner.core.store import Store
from tuner.widgets import views
from tuner.widgets.latency import LatencyPanel, LatencyView


def request(sent: float, gaps: list) -> Event:
    r = L.RequestTiming(sent, ttft=0.2, e2e=0.2 + sum(g for g, _ in gaps), tokens=1 + sum(n for _, n in gaps),
                        gaps=tuple(gaps))
    return Event(sent + r.e2e, EventKind.LOAD_REQUEST, r.to_data())


def store_with(*events: Event) -> Store:
    st = Store()
    for e in sorted(events, key=lambda e: e.t):
        st.add(e)
    return st


def text(view: LatencyView) -> str:
    panel = LatencyPanel()
    panel._view = view
    shown = panel.render()
    return "\n".join(line.plain for line in getattr(shown, "renderables", [shown]))


def test_hidden_without_any_latency_event():
    assert views.latency_view(store_with(Event(1.0, EventKind.LOAD_STARTED, {"concurrency": 2})), 10.0, 30.0) is None


def test_the_drivers_exact_figures_beside_the_servers_bucket_under_rate():
    # Two requests: ITL 10 ms per token (one burst of 4 over 40 ms), 20 ms (one burst of 2 over 40 ms).
    buckets = {(0.02, 0.04): 5.0, (0.01, 0.02): 3.0}
    st = store_with(Event(0.0, EventKind.LOAD_STARTED, {"concurrency": 4, "rate": 2.0}),
                    request(1.0, [(0.04, 4)]), request(2.0, [(0.04, 2)]),
                    Event(3.0, EventKind.LATENCY_BUCKETS, {"itl": L.buckets_data(buckets)}))
    view = views.latency_view(st, 10.0, 30.0)
    itl = next(r for r in view.rows if r.label == "ITL")
    assert itl.p99 == pytest.approx(L.percentile([0.01] * 4 + [0.02] * 2, 0.99))
    assert itl.server_p99 == "≤ 40 ms"
    ttft = next(r for r in view.rows if r.label == "TTFT")
    assert ttft.p50 == pytest.approx(0.2) and ttft.server_p99 == ""
    assert view.requests == 2 and view.notes == ()
    shown = text(view)
    assert "ITL" in shown and "≤ 40 ms" in shown and "2 requests (exact)" in shown


def test_one_line_each_for_no_histograms_and_a_closed_loop():
    st = store_with(Event(0.0, EventKind.LOAD_STARTED, {"concurrency": 4}),
                    Event(0.5, EventKind.LATENCY_UNAVAILABLE, {"reason": L.NO_HISTOGRAMS}),
                    request(1.0, [(0.04, 4)]))
    view = views.latency_view(st, 10.0, 30.0)
    assert view.notes == (L.NO_HISTOGRAMS, views.NO_RATE)
    assert all(r.server_p99 == "" for r in view.rows)
    assert views.NO_RATE in text(view)


def test_no_load_says_the_figures_are_the_servers():
    st = store_with(Event(3.0, EventKind.LATENCY_BUCKETS, {"ttft": L.buckets_data({(1.0, 2.0): 3.0})}))
    view = views.latency_view(st, 10.0, 30.0)
    assert view.notes == (views.NO_LOAD,)
    assert [(r.label, r.server_p99) for r in view.rows] == [("TTFT", "≤ 2 s")]


@pytest.mark.slow
def test_the_panel_on_the_main_screen_under_a_rate_load(engine):
    from tuner.app import make_app
    from tuner.backends import connect
    from tuner.backends.load import builtin_prompts
    from tuner.core.session import Session

    from .helpers import wait_for

    async def scenario():
        session = Session(connect(engine.url))
        app = make_app(session)
        async with app.run_test(size=(120, 40)) as pilot:
            panel = app.main.query_one("#latency-panel")
            session.start_load(builtin_prompts(), 4, max_new_tokens=16, rate=4.0)
            await wait_for(pilot, lambda: any(r.label == "ITL" and r.server_p99 and r.p99 == r.p99
                                              for r in app.main.query_one("#latency", LatencyPanel).view.rows),
                           why="ITL from both sources in the panel")
            assert panel.display
            shown = text(app.main.query_one("#latency", LatencyPanel).view)
            assert "ITL" in shown and "≤ " in shown and views.NO_RATE not in shown
            session.stop_load()
    asyncio.run(scenario())


def test_the_ab_judges_p99_itl_once_per_change_off_the_ui_thread():
    import random

    from harness import wait_until

    from tuner.widgets.ab import Metric, metric_line

    rng, st = random.Random(3), Store()
    st.add(Event(0.0, EventKind.LOAD_STARTED, {"concurrency": 2}))

    def requests(t0, t1, gap_s):
        t = t0
        while t + 1.0 < t1:
            gaps = tuple((gap_s * rng.uniform(0.8, 1.2), 1) for _ in range(10))
            r = L.RequestTiming(t, 0.05, 0.05 + sum(g for g, _ in gaps), 11, gaps)
            st.add(Event(t + r.e2e, EventKind.LOAD_REQUEST, r.to_data()))
            t += 0.5
    requests(0.0, 60.0, 0.040)
    cache = views.LatencyABCache()
    assert cache.get(st, 60.0) is None                       # no change yet
    st.add(Event(60.0, EventKind.CONFIG_CHANGED, {"old": {}, "new": {}}))
    requests(60.0, 120.0, 0.025)
    lat = wait_until(lambda: cache.get(st, 120.0), 60, "the bootstrap's verdict")
    assert lat.status == "ready" and lat.verdict == "better" and lat.after_s < lat.before_s
    assert cache.get(st, 121.0) is lat                       # the same change and 10-s slot: not judged again
    line = metric_line(Metric("ITL p99 ms", lat.before_s * 1e3, lat.after_s * 1e3, lat.ratio, lat.lo, lat.hi,
                              "ITL", lower_better=True)).plain
    assert line.startswith("ITL p99 ms") and line.endswith("better") and "-" in line
