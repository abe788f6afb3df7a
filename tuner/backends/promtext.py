"""Prometheus text → a small lookup of samples, with SGLang's label habits handled.

Parsing is prometheus_client's own text parser; this module adds the lookups the core needs (sum a
family over label sets, keep only the lowest tp_rank when several ranks report) and turns garbage into
one MetricsParseError line. It must not derive rates: that is tuner.backends.derive.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from tuner.core.text import terminal_safe

NAN = math.nan
# The deepest draft position any server reports: the engine caps num_draft_tokens at 64, and SGLang's
# trees are far shallower. A label k beyond it is a server's mistake (or an attack: k="20000000"
# would size a 20-million-entry list) and is left out.
MAX_ACCEPT_POSITION = 64
# Where a parse error is, is looked for in this many lines only (each is parsed on its own).
_BAD_LINE_SEARCH = 2000


class MetricsParseError(ValueError):
    """The /metrics body is not Prometheus text (one line, for people)."""


Labels = Mapping[str, str]


class MetricSet:
    """Samples by sample name (e.g. ``sglang:realtime_tokens_total``), each a list of (labels, value)."""

    def __init__(self, samples: Mapping[str, list[tuple[dict[str, str], float]]]) -> None:
        self._s = dict(samples)

    def __contains__(self, name: str) -> bool:
        return name in self._s

    def names(self) -> list[str]:
        return sorted(self._s)

    def has_prefix(self, prefix: str) -> bool:
        return any(n.startswith(prefix) for n in self._s)

    def samples(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        """Samples of `name` whose labels include every `match` pair."""
        return [(lab, v) for lab, v in self._s.get(name, ()) if all(lab.get(k) == str(x) for k, x in match.items())]

    def value(self, name: str, **match: str) -> float:
        """The sum over matching label sets, reporting rank only; NaN when absent.

        SGLang labels scheduler metrics with tp_rank; normally only the stats rank reports, but with
        --enable-metrics-for-all-schedulers every rank does, and summing would count TP times over.
        So when a tp_rank label is present only the lowest rank's samples are summed.
        """
        got = self.samples(name, **match)
        if not got:
            return NAN
        ranks = [lab["tp_rank"] for lab, _ in got if "tp_rank" in lab]
        if ranks:
            lowest = min(ranks, key=lambda r: (len(r), r))
            got = [(lab, v) for lab, v in got if lab.get("tp_rank", lowest) == lowest]
        return float(sum(v for _, v in got))

    def by_label(self, name: str, label: str, **match: str) -> dict[str, float]:
        """{label value: summed value} for one family, e.g. forward seconds by category."""
        out: dict[str, float] = defaultdict(float)
        for lab, v in self.samples(name, **match):
            if label in lab:
                out[lab[label]] += v
        return dict(out)


def parse_metrics(text: str) -> MetricSet:
    """Parse a /metrics body. Raises MetricsParseError (one line) on anything that is not Prometheus text."""
    head = text[:200].lstrip().lower()
    if head.startswith(("<!doctype", "<html", "<?xml", "{", "[")):
        kind = "HTML" if "html" in head else "JSON" if head[:1] in "{[" else "XML"
        raise MetricsParseError(f"/metrics answered {kind}, not Prometheus text")
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[s.name].append((dict(s.labels), float(s.value)))
    except Exception as e:   # the parser raises ValueError, IndexError, KeyError... on garbage
        line = _first_bad_line(text)
        raise MetricsParseError(f"/metrics is not valid Prometheus text ({type(e).__name__}"
                                + (f" near {line!r}" if line else "") + ")") from None
    return MetricSet(samples)


def _first_bad_line(text: str) -> str:
    for n, raw in enumerate(text.splitlines()):
        if n >= _BAD_LINE_SEARCH:
            break
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except Exception:
            return terminal_safe(line[:60])
    return ""


def tail_counts(ms: MetricSet, name: str, label: str = "k") -> list[float]:
    """A counter family indexed by an integer label (k = 0, 1, ...) as a dense list; [] when absent.

    Labels that are not integers in 0..MAX_ACCEPT_POSITION, and values that are not finite, are left
    out: one sample must not size an allocation."""
    by = ms.by_label(name, label)
    idx: dict[int, float] = {}
    for k, v in by.items():
        if not (k.isascii() and k.isdigit() and len(k) <= 4) or not math.isfinite(v):
            continue
        if int(k) <= MAX_ACCEPT_POSITION:
            idx[int(k)] = v
    if not idx:
        return []
    return [idx.get(i, 0.0) for i in range(max(idx) + 1)]


def rank_info(ms: MetricSet) -> list[dict[str, str]]:
    """specdecode:rank_info label sets, sorted by tp_rank."""
    rows = [dict(lab) for lab, _ in ms.samples("specdecode:rank_info")]
    return sorted(rows, key=lambda r: int(r.get("tp_rank", "0") or 0) if str(r.get("tp_rank", "0")).isdigit() else 0)


def iter_families(text: str) -> Iterable[str]:   # for tests and debugging: family names in a body
    return [f.name for f in text_string_to_metric_families(text)]
