"""`specdecode-tune report FILE --out report.html`: a recording as a report people can read.

`--out` picks the format by extension (.html, .md, .json) unless `--format` says; `--perfetto
trace.json` writes a trace for ui.perfetto.dev; `--csv DIR` writes the series for pandas;
`--speculation-profile OUT.json` writes acceptance profiles (speculation_profile.json, a list). A file
that is not a readable recording is one line on stderr and status 1; a damaged one gives one line
per problem on stderr and a report of what is readable (status 0, the report says so too). Outputs
are checked first: an existing one is refused without --overwrite (status 2), the recording itself
is never written over, and a write that fails is one line (status 1). `--prometheus URL --from T --to T`
builds the same report from one server's series in Prometheus (tuner.fleet.prom_report) instead.
Reads only the file or Prometheus; never imports textual.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tuner.recording.outputs import OutputError
from tuner.report.acceptance_profile import MIN_VERIFIES

FORMATS = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, nargs="?", default=None, metavar="FILE",
                   help="a recording made by `specdecode-tune record` (or --prometheus instead)")
    p.add_argument("--prometheus", default=None, metavar="URL",
                   help="build the report from Prometheus' series of one server instead of a recording")
    p.add_argument("--selector", default=None, metavar="SEL",
                   help='with --prometheus: series labels that pick the server, e.g. \'{instance="10.0.0.1:30000"}\'')
    p.add_argument("--from", dest="t_from", default=None, metavar="T",
                   help="with --prometheus: start (Unix seconds, RFC 3339, now-1h; default now-1h)")
    p.add_argument("--to", dest="t_to", default=None, metavar="T", help="with --prometheus: end (default now)")
    p.add_argument("--out", "-o", type=Path, default=None, metavar="PATH",
                   help="the report to write: .html (default), .md or .json; '-' writes to stdout")
    p.add_argument("--format", choices=("html", "md", "json"), default=None, help="override the extension")
    p.add_argument("--perfetto", type=Path, default=None, metavar="OUT.json",
                   help="also write a Perfetto/Chrome trace (captured kernels and phase spans, series as counters)")
    p.add_argument("--csv", type=Path, default=None, metavar="DIR",
                   help="also write samples.csv (long format), events.csv and settings.csv into DIR")
    p.add_argument("--speculation-profile", type=Path, default=None, metavar="OUT.json",
                   help="also write speculation_profile.json: a list with one acceptance profile per setting "
                        f"measured over >= {MIN_VERIFIES} verify rounds (buckets in per_category); '-' writes to stdout")
    p.add_argument("--setting", default=None, metavar="LABEL",
                   help="with --speculation-profile: only this setting (its label as the report prints it, "
                        "e.g. 'steps=3 topk=1 draft_tokens=4 placement=sharded')")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing output files (never the recording itself, nor anything but a regular file)")


def render(summary, fmt: str) -> str:
    if fmt == "html":
        from tuner.report.html import render as html
        return html(summary)
    if fmt == "md":
        from tuner.report.markdown import render as md
        return md(summary)
    return json.dumps(summary.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n"


def run(args: argparse.Namespace) -> int:
    # A --csv directory this run makes is removed again when the run fails and it is still empty.
    made_csv = args.csv is not None and not os.path.lexists(args.csv)
    rc = _run(args)
    if rc != 0 and made_csv:
        try:
            os.rmdir(args.csv)
        except OSError:
            pass                   # not empty (some files written) or never made: left as is
    return rc


def _run(args: argparse.Namespace) -> int:
    from tuner.recording import RecordingError
    from tuner.recording.outputs import check_output, write_text
    from tuner.report import load, summarize

    def say(msg: str) -> None:
        print(f"specdecode-tune report: {msg}", file=sys.stderr)

    out = args.out
    if args.prometheus is not None:
        return _from_prometheus(args, say)
    if args.file is None:
        say("name a recording FILE, or --prometheus URL --from T --to T")
        return 2
    if args.selector is not None or args.t_from is not None or args.t_to is not None:
        say("--selector, --from and --to read Prometheus: they need --prometheus URL")
        return 2
    if str(args.out) == "-" and str(args.speculation_profile) == "-":
        say("--out - and --speculation-profile - would both write to stdout; name a file for one")
        return 2
    if args.setting is not None and args.speculation_profile is None:
        say("--setting picks a profile: it needs --speculation-profile OUT.json")
        return 2
    if out is None and args.perfetto is None and args.csv is None and args.speculation_profile is None:
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
    # Every output is checked before the recording is read: an existing file is refused without
    # --overwrite, the input is never written over, and an unwritable place is one line, not a traceback.
    try:
        for target in _targets(out, args.perfetto, args.csv, args.speculation_profile):
            check_output(target, overwrite=args.overwrite, inputs=_inputs(args.file))
    except OutputError as e:
        say(str(e))
        return 2
    try:
        members = _fleet_members(args.file)
        if members:
            return _fleet(args, out, fmt, members, say)
        data = load(args.file)
    except RecordingError as e:
        say(str(e))
        return 1
    summary = summarize(data)
    for p in data.problems:
        say(f"{p} (the report covers what is readable)")
    wrote = []
    try:
        if out is not None:
            text = render(summary, fmt)
            if str(out) == "-":
                sys.stdout.write(text)
            else:
                write_text(out, text)
                wrote.append(str(out))
        if args.perfetto is not None:
            from tuner.report.exports import write_perfetto
            for p in write_perfetto(summary, args.perfetto):
                say(p)
            wrote.append(f"{args.perfetto} (open in ui.perfetto.dev)")
        if args.csv is not None:
            from tuner.report.exports import write_csv
            wrote += [str(p) for p in write_csv(summary, args.csv)]
        if args.speculation_profile is not None:
            status = _write_profiles(summary, args.speculation_profile, args.setting, say)
            if status:
                if wrote:
                    say("wrote " + ", ".join(wrote))
                return status
            wrote.append(str(args.speculation_profile))
    except OutputError as e:
        say(str(e))
        if wrote:
            say("wrote " + ", ".join(wrote))
        return 1
    if summary.verdict:
        say(summary.verdict.sentences[0])
    if wrote:
        say("wrote " + ", ".join(wrote))
    return 0


def _fleet_members(path: Path) -> list[dict]:
    """A fleet recording's members; [] for a one-server recording (schema 1 included)."""
    from tuner.recording import open_recording
    from tuner.recording.reader import fleet_members

    with open_recording(path) as reader:
        return fleet_members(reader.header)


def _fleet(args: argparse.Namespace, out: Path | None, fmt: str | None, members: list[dict], say) -> int:
    """A fleet recording's report: the fleet summary, then each server's report (tuner.report.fleet)."""
    from tuner.recording.outputs import write_text
    from tuner.report.fleet import load_fleet, render as render_fleet

    if args.perfetto is not None or args.csv is not None or args.speculation_profile is not None or out is None:
        say(f"{args.file} records a fleet of {len(members)} servers: its report goes to --out (.html, .md, .json "
            "or -) only")
        return 2
    report = load_fleet(args.file, members)
    for name, summary in report.summaries.items():
        for p in summary.data.problems:
            say(f"{name}: {p} (the report covers what is readable)")
    text = render_fleet(report, fmt or "html")
    try:
        if str(out) == "-":
            sys.stdout.write(text)
        else:
            write_text(out, text)
    except OutputError as e:
        say(str(e))
        return 1
    for name, summary in report.summaries.items():
        if summary.verdict:
            say(f"{name}: {summary.verdict.sentences[0]}")
    if str(out) != "-":
        say(f"wrote {out}")
    return 0


def _from_prometheus(args: argparse.Namespace, say) -> int:
    """The same report, built from Prometheus' range of one server (tuner.fleet.prom_report)."""
    import time

    from tuner.fleet.prom_report import load as prom_load
    from tuner.fleet.prom_report import parse_time
    from tuner.fleet.prometheus import PrometheusError
    from tuner.recording.outputs import check_output, write_text
    from tuner.report import summarize

    if args.file is not None:
        say("--prometheus replaces the recording FILE: give one or the other")
        return 2
    if args.out is None or args.perfetto is not None or args.csv is not None or args.speculation_profile is not None:
        say("--prometheus writes the report to --out (.html, .md, .json or -) only: Prometheus keeps no traces")
        return 2
    fmt = args.format or ("md" if str(args.out) == "-" else FORMATS.get(args.out.suffix.lower()))
    if fmt is None:
        say(f"cannot tell the format of {args.out} (use .html, .md or .json, or --format)")
        return 2
    try:
        if str(args.out) != "-":
            check_output(args.out, overwrite=args.overwrite, inputs=[])
        now = time.time()
        t_from = parse_time(args.t_from or "now-1h", now)
        t_to = parse_time(args.t_to or "now", now)
        data = prom_load(args.prometheus, args.selector, t_from, t_to)
    except OutputError as e:
        say(str(e))
        return 2
    except PrometheusError as e:
        say(str(e))
        return e.rc
    summary = summarize(data)
    text = render(summary, fmt)
    try:
        if str(args.out) == "-":
            sys.stdout.write(text)
        else:
            write_text(args.out, text)
    except OutputError as e:
        say(str(e))
        return 1
    if summary.verdict:
        say(summary.verdict.sentences[0])
    if str(args.out) != "-":
        say(f"wrote {args.out}")
    return 0


def _inputs(path: Path) -> list[Path]:
    """The recording and the SQLite files that belong to it: none of them is ever an output."""
    return [path, Path(str(path) + "-wal"), Path(str(path) + "-shm")]


def _write_profiles(summary, path: Path, setting: str | None, say) -> int:
    """speculation_profile.json: the list of profiles (or the one --setting names); 0 when written."""
    from tuner.recording.outputs import write_text
    from tuner.report.acceptance_profile import profiles

    counts = summary.acceptance
    if setting is not None:
        labels = [c.label for c in counts]
        counts = [c for c in counts if c.label == setting.strip()]
        if not counts:
            say(f"--setting {setting!r} is not a speculative setting of this recording (settings: "
                + ("; ".join(labels) if labels else "none with verify rounds") + ")")
            return 2
    docs, notes = profiles(counts, summary.data)
    for n in notes:
        say(n)
    if not docs:
        say(f"no setting has {MIN_VERIFIES} verify rounds: no speculation profile written")
        return 1
    text = json.dumps(docs, indent=1, allow_nan=False) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
    else:
        write_text(path, text)
    return 0


def _targets(out: Path | None, perfetto: Path | None, csv_dir: Path | None,
             profile: Path | None = None) -> list[Path]:
    """The files this run would write (the CSV directory is made here when it is missing)."""
    from tuner.report.exports import CSV_FILES

    targets = [p for p in (out, perfetto, profile) if p is not None and str(p) != "-"]
    if len(set(map(str, targets))) < len(targets):
        raise OutputError("--out, --perfetto and --speculation-profile name the same file")
    if csv_dir is not None:
        if csv_dir.exists() and not csv_dir.is_dir():
            raise OutputError(f"--csv {csv_dir} is not a directory")
        try:
            csv_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot make {csv_dir}: {e.strerror or e}") from None
        targets += [csv_dir / name for name in CSV_FILES]
    return targets
