"""`serve --restrict-profiling` (what a server off loopback always does, D19): /start_profile's
output_dir must lie inside the trace root, and the refusal is SGLang's 400 with the reason. A real
`serve --tp-size 1` on loopback; on loopback without the flag SGLang's inputs are taken (the other
server tests cover that)."""

from __future__ import annotations

import httpx
import pytest

from tests.server.helpers import checked_server

pytestmark = pytest.mark.slow


def test_restricted_profiling_confines_output_dir(tmp_path):
    with checked_server(["--tp-size", "1", "--port", "0", "--restrict-profiling"]) as s:
        r = httpx.post(s.url + "/start_profile", json={"output_dir": str(tmp_path / "elsewhere"), "num_steps": 1},
                       timeout=60, trust_env=False)
        assert r.status_code == 400 and "inside the trace root" in r.text
        assert not (tmp_path / "elsewhere").exists()
        info = httpx.get(s.url + "/server_info", timeout=60, trust_env=False).json()
        assert info["restrict_profiling"] is True
