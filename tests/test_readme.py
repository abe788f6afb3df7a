"""The README stays a page a newcomer reads (at most 250 lines), its command table is the CLI's own
(tuner/cli.py), every relative link in it and in docs/ points at a file that exists, and the phase
record example in docs/protocol.md has exactly the record keys of probes/names.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from probes.names import RECORD_KEYS
from tuner.cli import commands_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TABLE = re.compile(r"<!-- commands:[^\n]*-->\n(.*?)\n<!-- /commands -->", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_fits_a_newcomer():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_the_command_table_is_the_clis():
    m = TABLE.search(README.read_text(encoding="utf-8"))
    assert m, "the README's command table markers are missing"
    assert m.group(1) == commands_markdown(), "paste tuner.cli.commands_markdown() into the README"


def test_every_relative_link_points_at_a_file():
    pages = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
    missing = []
    for page in pages:
        if not page.exists():
            continue
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_the_protocol_pages_record_example_has_the_record_keys():
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    block = re.search(r"```json\n(\{.*?\})\n```", text, re.S)
    assert block, "docs/protocol.md has no record example"
    assert set(json.loads(block.group(1))) == set(RECORD_KEYS)
