"""`specdecode-tune doctor URL [--json] [--wait-s S] [--probe] [--require CAP,...]`: the self-check to run first.

On an SGLang server it says, capability by capability, what works, what is missing, and the fix:
- speculation;
- `/metrics`, and SGLang's GPU time per graph category;
- the specdecode plugin's routes, which live in the HTTP process;
- the plugin in every scheduler process: one `specdecode:rank_info` per TP rank;
- whether its phase timers fire;
- the phase stream;
- live steps, which need an adaptive launch with topk 1;
- traces.

On the reference engine (`specdecode-tune serve`) all of these are built in, and it checks the same
readings.

Without `--enable-metrics` SGLang has no `/metrics`: the plugin's ranks then come from its stream
list and its timers from the phase stream, and only what needs `/metrics` names that flag as the fix.
Live steps are judged from the tiers the plugin publishes (specdecode_pinnable_steps): a launch
whose slots leave a tier out is told which steps it can pin and how `sglang-flags` adds the rest.

It reads through the server's backend (tuner.backends: its client, key and deadlines), with two
exceptions to reading: the SGLang backend's phase-timer lease (the one `attach` holds), and with
--probe one short `/generate`, so the timers have iterations to time. It never prints a key.
Exit status: 0 when every required capability works (--require, default all), 1 when one is missing,
2 when the server cannot be reached or the arguments are bad.
Several URLs, `--fleet` or `--router`: every server is checked at once (each on its own thread, its
reads bounded) and each gets one verdict line (tuner.commands.doctor_fleet); the exit status is the
worst of theirs.
Must not change a setting or start anything.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from probes.names import ADAPTIVE, R_PHASE_MS, STEPS, TOPK
from tuner.commands.fleet_options import add_fleet_server_arguments, fleet_of
from tuner.commands.options import OpenError, fail, open_session
from tuner.core.text import terminal_safe

OK, MISSING, UNKNOWN, NOTE = "ok", "missing", "unknown", "note"
SGLANG_VERSION = "0.5.23"      # the version the plugin's hooks were checked against
PLUGIN_FIX = ("install the plugin into the SERVER's Python: `pip install --no-deps specdecode-tune`; if "
              "SGLANG_PLUGINS is set, include `specdecode`; relaunch")
SEE_PLUGIN = "install the plugin (see `plugin routes`)"
METRICS_FIX = "relaunch SGLang with --enable-metrics"
HOOKS_LINE = "`specdecode plugin 2 registered 10 hooks (scheduler process)`"

# --require names -> the check they stand for (docs/sglang.md's doctor table lists them)
CAPABILITIES: dict[str, str] = {
    "speculation": "speculation", "metrics": "metrics (/metrics)", "gpu-time": "GPU time per graph",
    "plugin": "plugin routes (HTTP)", "ranks": "plugin in the schedulers", "timers": "phase timers",
    "stream": "phase stream", "live-steps": "live steps", "traces": "traces",
}
ENGINE_NAMES = {"ranks": "ranks reporting", "live-steps": "live settings"}


@dataclass
class Check:
    capability: str
    status: str          # ok | missing | unknown | note
    found: str
    fix: str = ""
    id: str = ""         # the --require name


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_fleet_server_arguments(p)
    p.add_argument("--wait-s", type=float, default=3.0,
                   help="how long to watch for decode iterations when checking the phase timers (default 3)")
    p.add_argument("--probe", action="store_true",
                   help="send one short /generate while watching, so an idle server has iterations to time")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--require", type=_require, default=None, metavar="CAP,...",
                   help="exit 1 only when one of these is missing (default: all): " + ", ".join(CAPABILITIES))


def _require(text: str) -> frozenset[str]:
    names = frozenset(x.strip() for x in text.split(",") if x.strip())
    unknown = sorted(names - set(CAPABILITIES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown capability {', '.join(unknown) or '(none)'}; "
                                         f"known: {', '.join(CAPABILITIES)}")
    return names


def run(args: argparse.Namespace) -> int:
    try:
        members = fleet_of(args)
    except OpenError as e:
        return fail("doctor", e, 2)
    if members is not None:
        from tuner.commands.doctor_fleet import run_fleet
        for note in getattr(args, "fleet_notes", []):      # targets --prometheus left out, and why
            print(terminal_safe(f"specdecode-tune doctor: {note}"), file=sys.stderr)
        return run_fleet(args, members, diagnose, CAPABILITIES, MISSING)
    try:     # the session is never started: doctor reads on its own schedule, not the pollers'
        with open_session(args) as opened:
            head, checks = diagnose(opened.backend, args.wait_s, args.probe)
    except OpenError as e:
        return fail("doctor", e, 2)       # unreachable is 2 here (the exit statuses above)
    required = args.require or frozenset(CAPABILITIES)
    failed = [c for c in checks if c.status == MISSING and c.id in required]
    if args.json:
        print(json.dumps({"server": head, "checks": [asdict(c) for c in checks],
                          "required": sorted(required), "ok": not failed}, indent=1))
    else:
        print(format_checks(head, checks, required))
    return 1 if failed else 0


def format_checks(head: str, checks: list[Check], required: frozenset[str] = frozenset(CAPABILITIES)) -> str:
    mark = {OK: "ok ", MISSING: "NO ", UNKNOWN: " ? ", NOTE: " - "}
    lines = [terminal_safe(head)]
    for c in checks:
        lines.append(terminal_safe(f"  {mark.get(c.status, ' ? ')} {c.capability:<26} {c.found}"))
        if c.fix:
            lines.append(terminal_safe(f"        fix: {c.fix}"))
    missing = [c for c in checks if c.status == MISSING]
    needed = [c for c in missing if c.id in required]
    if not missing:
        lines.append("everything this tool uses is present")
    elif len(needed) == len(missing):
        lines.append(f"{len(missing)} missing")
    else:
        lines.append(f"{len(missing)} missing, {len(needed)} of them required (--require)")
    return "\n".join(lines)


def diagnose(backend, wait_s: float = 3.0, probe: bool = False) -> tuple[str, list[Check]]:
    """(a one-line description of the server, the checks in order) of a connected backend, from
    the /server_info it read; every failed read here is a check's finding."""
    from tuner.backends.common_info import common_info, internal_state

    http, kind, raw = backend.http, backend.kind, backend.raw_info
    info = common_info(kind, raw)
    st = internal_state(raw)
    sglang = kind == "sglang"
    name = "SGLang" if sglang else "the reference engine (specdecode-tune serve)"
    tp = info.get("tp_size")
    head = f"{name} {info.get('version') or '?'} · {info.get('model') or '?'} · TP {tp or '?'} · {http.url}"
    checks: list[Check] = []
    if sglang and info.get("version") and str(info["version"]) != SGLANG_VERSION:
        checks.append(Check("SGLang version", NOTE, f"{info['version']}; the plugin was checked against {SGLANG_VERSION}",
                            "if a hook stops firing after an upgrade, the phase-timer check below says so"))
    checks.append(_speculation(raw, st))
    metrics, text = _metrics(http)
    checks.append(_metrics_check(text, sglang))
    if sglang:
        checks.append(_device_timers(metrics))
    plugin, streams = _plugin_routes(http)
    if sglang:
        checks.append(plugin)
    has_plugin = plugin.status == OK
    # The timers run first: their lease (and --probe's request) is what makes an idle SGLang's ranks
    # write their streams, which is where ranks are read from without /metrics.
    timers = _timers(backend, metrics, wait_s, probe, has_plugin)
    if metrics is None and sglang and has_plugin:
        _, streams = _plugin_routes(http)
    checks.append(_ranks(metrics, tp, sglang, streams if has_plugin else None))
    checks.append(timers)
    checks.append(_stream(http, sglang))
    checks.append(_live_steps(raw, st, sglang, has_plugin))
    checks.append(Check("traces", OK, "POST /start_profile, then `specdecode-tune analyze` on the rank files"))
    by_name = {v: k for k, v in CAPABILITIES.items()} | {v: k for k, v in ENGINE_NAMES.items()}
    for c in checks:
        c.id = by_name.get(c.capability, "")
    return head, checks


def _speculation(raw: dict, st: dict) -> Check:
    algo = st.get("speculative_algorithm", raw.get("speculative_algorithm"))
    steps = st.get(STEPS, raw.get(STEPS))
    topk = st.get(TOPK, raw.get(TOPK))
    if not algo or str(algo).upper() == "NONE":
        return Check("speculation", MISSING, "no speculative algorithm: nothing to profile or tune",
                     "launch with --speculative-algorithm EAGLE3 --speculative-draft-model-path HEAD")
    return Check("speculation", OK, f"{algo}, steps {steps}, topk {topk}")


def _metrics(http) -> tuple[Any, str | None]:
    from tuner.backends.http import ServerError
    from tuner.backends.promtext import MetricsParseError, parse_metrics

    try:
        text = http.get_text("/metrics")
        return parse_metrics(text), text
    except (ServerError, MetricsParseError):
        return None, None


def _metrics_check(text: str | None, sglang: bool) -> Check:
    if text is None:
        return Check("metrics (/metrics)", MISSING, "no Prometheus text at /metrics",
                     "launch SGLang with --enable-metrics" if sglang else "launch serve without --disable-metrics")
    n = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return Check("metrics (/metrics)", OK, f"{n} series")


def _device_timers(metrics) -> Check:
    name = "sglang:forward_execution_seconds_total"
    if metrics is None:
        return Check("GPU time per graph", MISSING, "no /metrics to read it from",
                     f"{METRICS_FIX} and SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 in its environment")
    cats = sorted({lab.get("category", "") for lab, _ in metrics.samples(name)}) if metrics else []
    if "target_verify" in cats or "eagle_draft" in cats:
        return Check("GPU time per graph", OK, ", ".join(cats))
    return Check("GPU time per graph", MISSING, f"no {name} by category",
                 "set SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 in the server's environment and relaunch")


def _plugin_routes(http) -> tuple[Check, list[str]]:
    """The routes check, and the TP ranks whose stream files the plugin lists."""
    from tuner.backends.http import ServerError

    try:
        body = http.get_json("/specdecode/streams")
    except ServerError as e:
        return Check("plugin routes (HTTP)", MISSING, str(e), PLUGIN_FIX), []
    if not isinstance(body, dict) or body.get("plugin") != "specdecode":
        return Check("plugin routes (HTTP)", MISSING, "/specdecode/streams does not answer as the plugin",
                     PLUGIN_FIX), []
    streams = body.get("streams") if isinstance(body.get("streams"), list) else []
    ranks = sorted({str(x["rank"]) for x in streams if isinstance(x, dict) and isinstance(x.get("rank"), int)},
                   key=int)
    return Check("plugin routes (HTTP)", OK, f"plugin {body.get('version', '')}".strip()), ranks


def _ranks(metrics, tp: int | None, sglang: bool, streams: list[str] | None = None) -> Check:
    what = "plugin in the schedulers" if sglang else "ranks reporting"
    ranks = sorted({lab.get("tp_rank") for lab, _ in metrics.samples("specdecode:rank_info")} - {None},
                   key=lambda r: int(r) if str(r).isdigit() else 0) if metrics else []
    source = ""
    if not ranks and metrics is None and streams is not None:
        # No /metrics: each rank's stream file says its plugin ran a timed iteration.
        ranks, source = streams, " (from their phase streams; no /metrics)"
        if not ranks:
            return Check(what, UNKNOWN, "no /metrics, and no rank has written its phase stream yet (no timed "
                         "decode iteration)", "send traffic while it watches or pass --probe; "
                         f"{METRICS_FIX} adds the plugin's specdecode:rank_info")
    if not ranks:
        return Check(what, MISSING, "no specdecode:rank_info in /metrics",
                     (SEE_PLUGIN + f"; then each TP rank's log says {HOOKS_LINE}")
                     if sglang else "the engine's ranks have not reported yet: retry")
    want = [str(r) for r in range(tp)] if isinstance(tp, int) else ranks
    lost = [r for r in want if r not in ranks]
    if lost:
        return Check(what, MISSING, f"TP ranks {', '.join(ranks)} report{source}; {', '.join(lost)} do not",
                     "every scheduler process must load the plugin: check those ranks' logs for the "
                     "`registered 10 hooks` line and that SGLANG_PLUGINS (if set) reaches them")
    return Check(what, OK, f"TP ranks {', '.join(ranks)}{source}")


def _progress(http, metrics) -> tuple[float, float]:
    """(decode iterations so far, phase seconds so far): the plugin's counters, or on the reference
    engine (no iteration counter in /metrics) its phase stream's newest sequence number."""
    from tuner.backends.http import ServerError

    if metrics is None:
        return float("nan"), float("nan")
    secs = sum(v for _, v in metrics.samples("specdecode:phase_seconds_total"))
    if metrics.samples("specdecode:iterations_total"):
        return sum(v for _, v in metrics.samples("specdecode:iterations_total")), secs
    try:
        body = http.get_json("/specdecode/phases", params={"after": 1 << 62, "limit": 1})
        return float(body.get("next", "nan")) if isinstance(body, dict) else float("nan"), secs
    except (ServerError, TypeError, ValueError):
        return float("nan"), secs


def _timers(backend, metrics, wait_s: float, probe: bool, plugin: bool = True) -> Check:
    from tuner.backends.http import ServerError

    http, sglang = backend.http, backend.kind == "sglang"
    if sglang and not plugin:
        return Check("phase timers", MISSING, "the plugin is not loaded", SEE_PLUGIN)
    # The reference engine's counter appears with its first decoded iteration: a server that has not
    # decoded yet is not missing its timers when --probe is about to make it decode.
    unseen = metrics is None or not metrics.samples("specdecode:phase_seconds_total")
    if unseen and not sglang and (not probe or metrics is None):
        return Check("phase timers", MISSING, "no specdecode:phase_seconds_total in /metrics",
                     "retry once the server has decoded, or pass --probe")
    if sglang and metrics is not None and unseen:
        return Check("phase timers", MISSING, "no specdecode:phase_seconds_total in /metrics", SEE_PLUGIN)
    if sglang:
        try:   # the lease attach takes: timers run only while someone watches
            status, body = backend.take_timer_lease()
            if status != 200 or body != [True]:
                return Check("phase timers", MISSING, f"the timer lease was refused (HTTP {status} {body!r:.40})",
                             SEE_PLUGIN)
        except ServerError as e:
            return Check("phase timers", MISSING, f"the timer lease failed: {e}", SEE_PLUGIN)
    # Without /metrics (SGLang without --enable-metrics) the phase stream is the only witness: its
    # records exist only for iterations the timers measured.
    by_stream = metrics is None
    it0, s0 = _stream_progress(http) if by_stream else _progress(http, metrics)
    if by_stream:
        s0 = 0.0                 # from here on, only the records after it0 count
    sender = threading.Thread(target=_one_request, args=(http,), daemon=True) if probe else None
    if sender is not None:
        sender.start()
    deadline = time.monotonic() + max(0.5, wait_s)
    it1, s1 = it0, s0
    while time.monotonic() < deadline:
        time.sleep(0.25)     # polling a remote server's counters (nothing here to wait on)
        if by_stream:
            it1, s1 = _stream_progress(http, int(it0)) if it0 == it0 else (it0, 0.0)
        else:
            m, _ = _metrics(http)
            it1, s1 = _progress(http, m)
        if it1 > it0 and (s1 > 0 if by_stream else s1 > s0):
            break
    if sender is not None:
        sender.join(timeout=max(1.0, wait_s))
    if by_stream:
        if it1 > it0 and s1 > 0:
            return Check("phase timers", OK, f"{it1 - it0:.0f} iterations timed, {1e3 * s1:.1f} ms of phases "
                         "(from the phase stream; no /metrics)")
        return Check("phase timers", UNKNOWN, f"no timed iteration in the phase stream in {wait_s:g} s",
                     "send traffic while it watches or pass --probe; without /metrics an idle server and hooks "
                     f"that do not fire look the same ({METRICS_FIX} adds the plugin's iteration counter)")
    if not it1 > it0:
        return Check("phase timers", UNKNOWN, f"no decode iterations in {wait_s:g} s to time",
                     "send traffic while it watches, or pass --probe")
    if not s1 > s0:
        return Check("phase timers", MISSING, f"{it1 - it0:.0f} iterations, but the timers stayed at zero",
                     "the hooks do not fire on this SGLang: check the log for `registered 10 hooks` and the "
                     "version note above; SPECDECODE_TIMERS=always keeps them on without a lease")
    return Check("phase timers", OK, f"{it1 - it0:.0f} iterations timed, {1e3 * (s1 - s0):.1f} ms of phases")


def _stream_progress(http, after: int = 0) -> tuple[float, float]:
    """(the newest sequence number, phase seconds of the records after `after`) of rank 0's phase
    stream, paging forward from `after` to its end (a ring of at most 4096 records)."""
    from tuner.backends.http import ServerError

    secs = 0.0
    try:
        for _ in range(16):
            body = http.get_json("/specdecode/phases", params={"after": after, "limit": 1024})
            recs = body.get("records") if isinstance(body, dict) else None
            nxt = body.get("next") if isinstance(body, dict) else None
            if not recs or not isinstance(nxt, int) or nxt <= after:
                break
            for r in recs:
                ph = r.get(R_PHASE_MS) if isinstance(r, dict) else None
                if isinstance(ph, dict):
                    secs += sum(v for v in ph.values() if isinstance(v, (int, float))) / 1e3
            after = nxt
        return float(after), secs
    except (ServerError, TypeError, ValueError):
        return float("nan"), float("nan")


def _one_request(http) -> None:
    from tuner.backends.http import ServerError

    try:
        http.post_json("/generate", {"text": "The quick brown fox", "sampling_params": {
            "max_new_tokens": 32, "temperature": 0, "ignore_eos": True}}, deadline=30.0)
    except ServerError:
        pass     # the timer check reports what it saw


def _stream(http, sglang: bool) -> Check:
    from tuner.backends.http import ServerError

    try:
        body = http.get_json("/specdecode/phases", params={"after": 0, "limit": 1})
    except ServerError as e:
        return Check("phase stream", MISSING, str(e), SEE_PLUGIN if sglang else "")
    if not isinstance(body, dict) or "records" not in body:
        return Check("phase stream", MISSING, "/specdecode/phases does not answer with records",
                     SEE_PLUGIN if sglang else "")
    return Check("phase stream", OK, f"next seq {body.get('next')}")


def _live_steps(raw: dict, st: dict, sglang: bool, plugin: bool) -> Check:
    from tuner.backends.sglang.pinnable import FLAGS_FIX, parse as parse_pinnable

    if not sglang:
        return Check("live settings", OK, "steps, topk, draft tokens and placement change live")
    adaptive = bool(st.get(ADAPTIVE, raw.get(ADAPTIVE, False)))
    topk = st.get(TOPK, raw.get(TOPK))
    relaunch = ("launch with --speculative-adaptive --speculative-eagle-topk 1 and a config whose every slot "
                "lists the steps you want: " + FLAGS_FIX.format(steps="1,2,3,5"))
    if not plugin:
        return Check("live steps", MISSING, "needs the plugin", SEE_PLUGIN + "; and " + relaunch)
    if not adaptive or topk not in (1, None):
        return Check("live steps", MISSING, f"adaptive {adaptive}, topk {topk}", relaunch)
    pin = parse_pinnable(st)
    if pin is None:
        return Check("live steps", UNKNOWN, "the plugin publishes no pinnable tiers (plugin 1): a pin needs its "
                     "tier in every batch-size slot", "upgrade the plugin in the server's Python")
    if not pin.allowed:
        return Check("live steps", MISSING, f"no tier can be pinned at the {pin.max_bs} requests this server runs "
                     f"(slots {pin.slots_text()})", FLAGS_FIX.format(steps="1,2,3,5"))
    partial = pin.partial()
    found = f"pinnable steps {', '.join(map(str, pin.allowed))} at every batch size up to {pin.max_bs}"
    if partial:
        full = [s for s in pin.allowed if s not in partial]
        found = (f"pinnable everywhere: {', '.join(map(str, full)) or 'none'}; at some batch sizes only: "
                 + "; ".join(f"{s} at {w}" for s, w in partial.items())
                 + " (SGLang's own policy runs elsewhere)")
        return Check("live steps", OK, found,
                     "for every tier at every batch size: " + FLAGS_FIX.format(steps=",".join(map(str, pin.allowed))))
    return Check("live steps", OK, found)
