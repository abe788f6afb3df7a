"""`specdecode-tune report FILE --out report.html`: a recording as a report people can read.

`--out` picks the format by extension (.html, .md, .json) unless `--format` says; `--perfetto
trace.json` writes a trace for ui.perfetto.dev; `--csv DIR` writes the series for pandas. A file
that is not a readable recording is one line on stderr and status 1; a damaged one gives one line
per problem on stderr and a report of what is readable (status 0, the report says so too).
Reads only the file; never imports textual.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FORMATS = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, metavar="FILE", help="a recording made by `specdecode-tune record`")
    p.add_argument("--out", "-o", type=Path, default=None, metavar="PATH",
                   help="the report to write: .html (default), .md or .json; '-' writes to stdout")
    p.add_argument("--format", choices=("html", "md", "json"), default=None, help="override the extension")
    p.add_argument("--perfetto", type=Path, default=None, metavar="OUT.json",
                   help="also write a Perfetto/Chrome trace (captured kernels and phase spans, series as counters)")
    p.add_argument("--csv", type=Path, default=None, metavar="DIR",
                   help="also write samples.csv (long format), events.csv and settings.csv into DIR")


def render(summary, fmt: str) -> str:
    if fmt == "html":
        from tuner.report.html import render as html
        return html(summary)
    if fmt == "md":
        from tuner.report.markdown import render as md
        return md(summary)
    return json.dumps(summary.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n"


def run(args: argparse.Namespace) -> int:
    from tuner.recording import RecordingError
    from tuner.report import load, summarize

    def say(msg: str) -> None:
        print(f"specdecode-tune report: {msg}", file=sys.stderr)

    out = args.out
    if out is None and args.perfetto is None and args.csv is None:
        out = args.file.with_suffix(".html")
    fmt = args.format
    if out is not None and fmt is None:
        fmt = "md" if str(out) == "-" else FORMATS.get(out.suffix.lower())
        if fmt is None:
            say(f"cannot tell the format of {out} (use .html, .md or .json, or --format)")
            return 2
    if not args.file.exists():
        say(f"{args.file}: no such file")
        return 1
    try:
        data = load(args.file)
    except RecordingError as e:
        say(str(e))
        return 1
    summary = summarize(data)
    for p in data.problems:
        say(f"{p} (the report covers what is readable)")
    wrote = []
    if out is not None:
        text = render(summary, fmt)
        if str(out) == "-":
            sys.stdout.write(text)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            wrote.append(str(out))
    if args.perfetto is not None:
        from tuner.report.exports import write_perfetto
        args.perfetto.parent.mkdir(parents=True, exist_ok=True)
        for p in write_perfetto(summary, args.perfetto):
            say(p)
        wrote.append(f"{args.perfetto} (open in ui.perfetto.dev)")
    if args.csv is not None:
        from tuner.report.exports import write_csv
        wrote += [str(p) for p in write_csv(summary, args.csv)]
    if summary.verdict:
        say(summary.verdict.sentences[0])
    if wrote:
        say("wrote " + ", ".join(wrote))
    return 0
