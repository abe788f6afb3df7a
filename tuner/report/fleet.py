"""The report of a fleet recording: a fleet summary (one row per server: tok/s, τ, the settings it
ran, errors) and then each server's own report as a section.

Each member is read on its own (tuner.report.data.load(path, server=NAME)) and summarised exactly as
a one-server recording, so a section says what that server's report would say. Renders Markdown,
HTML and JSON like the one-server report; must not read a server or import textual.
"""

from __future__ import annotations

import html as _html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.core.events import EventKind
from tuner.report.summary import Summary

ERROR_KINDS = (EventKind.POLL_ERROR, EventKind.LOAD_ERROR, EventKind.DISCONNECTED)


@dataclass
class FleetReport:
    path: Path
    members: list[dict[str, Any]]                 # {name, url} in the fleet's order
    summaries: dict[str, Summary]                 # by name

    def rows(self) -> list[dict[str, Any]]:
        return [server_row(m["name"], m.get("url", ""), self.summaries[m["name"]]) for m in self.members]

    def to_json(self) -> dict[str, Any]:
        return {"fleet": {"file": self.path.name, "servers": self.rows()},
                "servers": {n: s.to_json() for n, s in self.summaries.items()}}


def load_fleet(path: str | Path, members: list[dict[str, Any]]) -> FleetReport:
    """Every member's part of the recording, summarised. RecordingError when a part is unreadable."""
    from tuner.report import load, summarize

    return FleetReport(Path(path), members, {m["name"]: summarize(load(path, server=m["name"])) for m in members})


def server_row(name: str, url: str, s: Summary) -> dict[str, Any]:
    """One server's line of the fleet summary: the figures of its fastest setting (or its longest
    one when nothing ranked), the settings it ran, its error events."""
    row = s.verdict.best if s.verdict else max(s.rows, key=lambda r: r.seconds, default=None)
    errors = sum(1 for e in s.data.event_list if e.kind in ERROR_KINDS)
    return {"server": name, "url": url, "tok_s": _num(row.tok_s if row else math.nan),
            "tau": _num(row.accept_len if row else math.nan), "setting": row.label if row else None,
            "settings": [r.label for r in s.rows], "errors": errors, "length_s": _num(s.data.length_s),
            "problems": list(s.data.problems)}


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


HEAD = ("server", "tok/s", "τ", "setting", "settings tried", "errors", "recorded s")


def _cells(r: dict[str, Any]) -> list[str]:
    return [r["server"], _f(r["tok_s"]), _f(r["tau"], "{:.2f}"), r["setting"] or "–", str(len(r["settings"])),
            str(r["errors"]), _f(r["length_s"], "{:.0f}")]


def render_md(f: FleetReport) -> str:
    from tuner.report.markdown import render

    def cell(x: str) -> str:
        return x.replace("|", "\\|")

    out = [f"# specdecode-tune fleet report — {f.path.name}", "", f"{len(f.members)} servers in one recording.", "",
           "## Fleet summary", "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(cell(c) for c in _cells(r)) + " |" for r in f.rows()]
    for m in f.members:
        # each server's own report one heading level down, under its name
        body = re.sub(r"(?m)^(#+) ", r"#\1 ", render(f.summaries[m["name"]]))
        out += ["", f"## Server {m['name']}", "", body.split("\n", 1)[1] if "\n" in body else body]
    return "\n".join(out).rstrip() + "\n"


def render_html(f: FleetReport) -> str:
    from tuner.report.html import render

    esc = _html.escape
    parts, head = [], None
    for m in f.members:
        page = render(f.summaries[m["name"]])
        start, end = page.index("<body>") + len("<body>"), page.rindex("</body>")
        head = head or page[:start]
        parts.append(f'<section id="server-{esc(m["name"])}"><h1>Server {esc(m["name"])}</h1>{page[start:end]}</section>')
    rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in _cells(r)) + "</tr>" for r in f.rows())
    table = ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in HEAD) + f"</tr></thead><tbody>{rows}"
             "</tbody></table>")
    title = f"specdecode-tune fleet report — {f.path.name}"
    head = re.sub(r"<title>.*?</title>", f"<title>{esc(title)}</title>", head or "<html><body>", count=1)
    return (f"{head}<h1>{esc(title)}</h1><h2>Fleet summary</h2>{table}" + "".join(parts) + "</body></html>\n")


def render(f: FleetReport, fmt: str) -> str:
    if fmt == "html":
        return render_html(f)
    if fmt == "md":
        return render_md(f)
    return json.dumps(f.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n"
