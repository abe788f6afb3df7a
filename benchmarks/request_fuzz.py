"""The request fuzz of tests/server/test_bounds.py and the chunked-reader fuzz of
tests/hostile/test_fuzz_chunked.py, run longer than CI runs them.

Part 1 sends `--requests` random bodies (every sampling field through each generate route: huge,
negative, float where int, NaN, strings, lists) to `serve --tp-size 2` (CPU, the shipped tiny model;
started here unless --url is given): every reply must be a 200 or a 400 naming a field sent, and
/health 200 after each. Part 2 runs the chunked reader's properties on `--chunked` random inputs.
Prints the counts (replies by route and status, seconds) as JSON.

    python benchmarks/request_fuzz.py --requests 5000 --chunked 200000
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import ROOT, on_path  # noqa: E402  (puts this checkout on sys.path)

on_path(ROOT, ROOT / "tests")

from tests.hostile.test_fuzz_chunked import RAW, _check, encode  # noqa: E402
from tests.server.test_bounds import _body, _field_named, _requests  # noqa: E402
from tuner.engine_process import EngineProcess, EngineStartError  # noqa: E402


def fuzz_requests(url: str, n: int) -> dict:
    counts: collections.Counter = collections.Counter()
    failures: list[str] = []
    with httpx.Client(base_url=url, timeout=120) as http:
        @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(_requests())
        def run(req):
            route, fields = req
            raw = json.dumps(_body(route, fields))
            r = http.post(route, content=raw, headers={"Content-Type": "application/json"})
            counts[f"{route} {r.status_code}"] += 1
            ok = r.status_code == 200
            if r.status_code == 400:
                body = r.json()
                msg = body["message"] if route != "/generate" else body["error"]["message"]
                ok = _field_named(msg, fields) and "\n" not in msg
            if not ok and len(failures) < 20:
                failures.append(f"{route} {raw[:200]} -> {r.status_code} {r.text[:200]}")
            if http.get("/health").status_code != 200 and len(failures) < 20:
                failures.append(f"unhealthy after {route} {raw[:200]}")

        run()
    return {"replies": dict(sorted(counts.items())), "failures": failures}


def fuzz_chunked(n: int) -> int:
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(RAW, st.binary(max_size=80)))
    def any_bytes(raw):
        _check(raw)

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.binary(max_size=24), max_size=6), st.booleans(), st.booleans())
    def round_trip(chunks, ext, lf_only):
        body = b"".join(chunks)
        got = _check(encode(chunks, ext, lf_only))
        assert got == (body if len(body) <= 64 else None)

    any_bytes()
    round_trip()
    return 2 * n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--chunked", type=int, default=100_000)
    ap.add_argument("--url", default=None)
    args = ap.parse_args()
    out: dict = {}
    t0 = time.monotonic()
    out["chunked_cases"] = fuzz_chunked(args.chunked) if args.chunked else 0
    out["chunked_s"] = round(time.monotonic() - t0, 1)
    if args.requests:
        server = None
        url = args.url
        if url is None:
            try:
                server = EngineProcess.start(["--tp-size", "2", "--port", "0"],
                                             env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout_s=300.0, cwd=ROOT)
            except EngineStartError as e:
                raise SystemExit(f"serve did not start: {e}") from None
            url = server.url
        t1 = time.monotonic()
        try:
            out.update(fuzz_requests(url, args.requests))
            out["server_alive"] = httpx.get(url + "/health", timeout=60).status_code == 200
        finally:
            if server is not None:
                server.stop(timeout=60.0)
        out["requests_s"] = round(time.monotonic() - t1, 1)
    print(json.dumps(out, indent=1))
    return 0 if not out.get("failures") else 1


if __name__ == "__main__":
    raise SystemExit(main())
