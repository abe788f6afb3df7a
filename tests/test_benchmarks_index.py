"""benchmarks/README.md indexes benchmarks/results/: every file there is linked from it (a link to a
folder covers the files in it), and every link in it points at a file or folder that exists."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCH / "results"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links() -> list[str]:
    return [t for t in LINK.findall((BENCH / "README.md").read_text(encoding="utf-8"))
            if not t.startswith(("http://", "https://", "mailto:"))]


def test_every_link_in_the_index_exists():
    missing = [t for t in _links() if not (BENCH / t).exists()]
    assert not missing, f"benchmarks/README.md links files that do not exist: {missing}"


def test_every_result_is_linked_from_the_index():
    linked = {(BENCH / t).resolve() for t in _links()}
    unlinked = [str(p.relative_to(RESULTS)) for p in sorted(RESULTS.rglob("*")) if p.is_file()
                and not ({p.resolve(), *p.resolve().parents} & linked)]
    assert not unlinked, f"add these to benchmarks/README.md: {unlinked}"


MAX_RESULT_FILES = 40
SUPERSEDED_NAME = re.compile(r"_run\d|old|new")


def test_results_stay_few_and_plainly_named():
    """One current result per question (issue "Code shape 3"): superseded runs leave the tree (git
    keeps them; benchmarks/README.md cites the commit), series fold into one file per question."""
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert len(files) <= MAX_RESULT_FILES, f"{len(files)} files in benchmarks/results (at most {MAX_RESULT_FILES})"
    odd = [str(p.relative_to(RESULTS)) for p in files if SUPERSEDED_NAME.search(p.name)]
    assert not odd, f"superseded-run names in benchmarks/results: {odd}"
