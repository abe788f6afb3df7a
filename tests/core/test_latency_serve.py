"""Latency end to end against the session's real `serve --tp-size 2`: `once --rate` drives Poisson
arrivals and reads both sources, the load driver's exact timings and the server's histogram buckets."""

from __future__ import annotations

import json

from tuner.cli import main


def test_once_reads_latency_from_both_sources_under_a_rate(tp2_server, capsys):
    rc = main(["once", tp2_server.url, "--rate", "6", "--load", "3", "--max-new-tokens", "12",
               "--seconds", "4", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0, r["problems"]
    lat = r["latency"]
    assert lat["requests"] >= 1
    drv, srv = lat["driver"], lat["server"]
    for kind in ("ttft", "itl", "e2e"):
        assert 0 < drv[kind]["p50"] <= drv[kind]["p90"] <= drv[kind]["p99"]
    assert drv["itl"]["n"] >= 11 * lat["requests"] - 11          # one per token after the first, at most one short a request
    assert drv["e2e"]["p99"] >= drv["ttft"]["p99"] > 0
    # The server's own ITL histogram moved while we watched; its percentiles are bucket bounds.
    lo, hi = srv["itl"]["p99"]
    assert srv["itl"]["n"] > 0 and (hi is None or lo < hi)
    assert lat["unavailable"] is None
