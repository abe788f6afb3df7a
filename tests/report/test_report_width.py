"""The HTML report's settings table fits a 1400-px window without horizontal scrolling (the page
was capped at 960 px, so the table needed a scrollbar at any width). Real report, real chromium."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from headless_chromium import chromium_path, open_page

ENGINE_FIXTURE = Path(__file__).parent / "fixtures" / "cpu-engine.db"
CHROMIUM = chromium_path()
WIDE = ("[...document.querySelectorAll('.wide')].map(e => ({after: (e.previousElementSibling || {}).textContent,"
        " scroll: e.scrollWidth, client: e.clientWidth}))")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; .ci/run does)")
def test_the_settings_table_needs_no_horizontal_scroll_at_1400px(tmp_path):
    out = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "tuner", "report", str(ENGINE_FIXTURE), "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    page = open_page(CHROMIUM, out, width=1400, selector="table", evaluate=WIDE)
    assert page.problems == [], page.problems
    settings = [w for w in page.value if "Settings tried" in str(w["after"])]
    assert settings, page.value
    for w in settings:
        assert w["scroll"] <= w["client"], f"the settings table scrolls: {w}"
