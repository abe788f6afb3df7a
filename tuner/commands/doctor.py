"""`specdecode-tune doctor URL [--json] [--wait-s S] [--probe]`: the self-check to run first.

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

It only reads, with two exceptions: the phase-timer lease that `attach` takes too, and with --probe
one short `/generate`, so the timers have iterations to time. It never prints a key.
Exit status: 0 when everything is present, 1 when something is missing, 2 when the server cannot be
reached or the arguments are bad.
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

from tuner.core.text import terminal_safe

OK, MISSING, UNKNOWN, NOTE = "ok", "missing", "unknown", "note"
SGLANG_VERSION = "0.5.23"      # the version the plugin's hooks were checked against
LEASE_S = 30
PLUGIN_FIX = ("install the plugin into the SERVER's Python: `pip install --no-deps specdecode-tune`; if "
              "SGLANG_PLUGINS is set, include `specdecode`; --enable-metrics for its counters; relaunch")
SEE_PLUGIN = "install the plugin (see `plugin routes`)"


@dataclass
class Check:
    capability: str
    status: str          # ok | missing | unknown | note
    found: str
    fix: str = ""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tuner.commands.keys import add_key_arguments

    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:30000")
    add_key_arguments(p)
    p.add_argument("--wait-s", type=float, default=3.0,
                   help="how long to watch for decode iterations when checking the phase timers (default 3)")
    p.add_argument("--probe", action="store_true",
                   help="send one short /generate while watching, so an idle server has iterations to time")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")


def run(args: argparse.Namespace) -> int:
    from tuner.backends import ServerError, connect
    from tuner.commands.keys import api_key_of

    try:
        key = api_key_of(args)
        backend = connect(args.url, api_key=key)
    except (ServerError, ValueError) as e:       # ApiKeyError is a ValueError
        print(terminal_safe(f"specdecode-tune doctor: {e}"), file=sys.stderr)
        return 2
    from tuner.backends.http import HttpClient

    http = HttpClient(args.url, key)
    try:
        head, checks = diagnose(http, backend.kind, args.wait_s, args.probe)
    except ServerError as e:
        print(terminal_safe(f"specdecode-tune doctor: {e}"), file=sys.stderr)
        return 2
    finally:
        http.close()
    if args.json:
        print(json.dumps({"server": head, "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        print(format_checks(head, checks))
    return 1 if any(c.status == MISSING for c in checks) else 0


def format_checks(head: str, checks: list[Check]) -> str:
    mark = {OK: "ok ", MISSING: "NO ", UNKNOWN: " ? ", NOTE: " - "}
    lines = [terminal_safe(head)]
    for c in checks:
        lines.append(terminal_safe(f"  {mark.get(c.status, ' ? ')} {c.capability:<26} {c.found}"))
        if c.fix:
            lines.append(terminal_safe(f"        fix: {c.fix}"))
    missing = sum(c.status == MISSING for c in checks)
    lines.append(f"{missing} missing" if missing else "everything this tool uses is present")
    return "\n".join(lines)


def diagnose(http, kind: str, wait_s: float = 3.0, probe: bool = False) -> tuple[str, list[Check]]:
    """(a one-line description of the server, the checks in order). Raises ServerError only when
    /server_info cannot be read; every other failed read is a check's finding."""
    from tuner.backends.common_info import common_info, internal_state

    raw = http.get_json("/server_info")
    info = common_info(kind, raw if isinstance(raw, dict) else {})
    st = internal_state(raw) if isinstance(raw, dict) else {}
    sglang = kind == "sglang"
    name = "SGLang" if sglang else "the reference engine (specdecode-tune serve)"
    tp = info.get("tp_size")
    head = f"{name} {info.get('version') or '?'} · {info.get('model') or '?'} · TP {tp or '?'} · {http.url}"
    checks: list[Check] = []
    if sglang and info.get("version") and str(info["version"]) != SGLANG_VERSION:
        checks.append(Check("SGLang version", NOTE, f"{info['version']}; the plugin was checked against {SGLANG_VERSION}",
                            "if a hook stops firing after an upgrade, the phase-timer check below says so"))
    checks.append(_speculation(raw if isinstance(raw, dict) else {}, st))
    metrics, text = _metrics(http)
    checks.append(_metrics_check(text, sglang))
    if sglang:
        checks.append(_device_timers(metrics))
    plugin = _plugin_routes(http)
    if sglang:
        checks.append(plugin)
    checks.append(_ranks(metrics, tp, sglang))
    checks.append(_timers(http, metrics, wait_s, probe, sglang))
    checks.append(_stream(http, sglang))
    checks.append(_live_steps(raw if isinstance(raw, dict) else {}, st, sglang, plugin.status == OK))
    checks.append(Check("traces", OK, "POST /start_profile, then `specdecode-tune analyze` on the rank files"))
    return head, checks


def _speculation(raw: dict, st: dict) -> Check:
    algo = st.get("speculative_algorithm", raw.get("speculative_algorithm"))
    steps = st.get("speculative_num_steps", raw.get("speculative_num_steps"))
    topk = st.get("speculative_eagle_topk", raw.get("speculative_eagle_topk"))
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
    cats = sorted({lab.get("category", "") for lab, _ in metrics.samples(name)}) if metrics else []
    if "target_verify" in cats or "eagle_draft" in cats:
        return Check("GPU time per graph", OK, ", ".join(cats))
    return Check("GPU time per graph", MISSING, f"no {name} by category",
                 "set SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 in the server's environment and relaunch")


def _plugin_routes(http) -> Check:
    from tuner.backends.http import ServerError

    try:
        body = http.get_json("/specdecode/streams")
    except ServerError as e:
        return Check("plugin routes (HTTP)", MISSING, str(e), PLUGIN_FIX)
    if not isinstance(body, dict) or body.get("plugin") != "specdecode":
        return Check("plugin routes (HTTP)", MISSING, "/specdecode/streams does not answer as the plugin", PLUGIN_FIX)
    return Check("plugin routes (HTTP)", OK, f"plugin {body.get('version', '')}".strip())


def _ranks(metrics, tp: int | None, sglang: bool) -> Check:
    what = "plugin in the schedulers" if sglang else "ranks reporting"
    ranks = sorted({lab.get("tp_rank") for lab, _ in metrics.samples("specdecode:rank_info")} - {None},
                   key=lambda r: int(r) if str(r).isdigit() else 0) if metrics else []
    if not ranks:
        return Check(what, MISSING, "no specdecode:rank_info in /metrics",
                     (SEE_PLUGIN + "; then each TP rank's log says `specdecode plugin 1 registered 9 hooks "
                      "(scheduler process)`") if sglang else "the engine's ranks have not reported yet: retry")
    want = [str(r) for r in range(tp)] if isinstance(tp, int) else ranks
    lost = [r for r in want if r not in ranks]
    if lost:
        return Check(what, MISSING, f"TP ranks {', '.join(ranks)} report; {', '.join(lost)} do not",
                     "every scheduler process must load the plugin: check those ranks' logs for the "
                     "`registered 9 hooks` line and that SGLANG_PLUGINS (if set) reaches them")
    return Check(what, OK, f"TP ranks {', '.join(ranks)}")


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


def _timers(http, metrics, wait_s: float, probe: bool, sglang: bool) -> Check:
    from tuner.backends.http import ServerError

    # The reference engine's counter appears with its first decoded iteration: a server that has not
    # decoded yet is not missing its timers when --probe is about to make it decode.
    unseen = metrics is None or not metrics.samples("specdecode:phase_seconds_total")
    if unseen and (sglang or not probe or metrics is None):
        return Check("phase timers", MISSING, "no specdecode:phase_seconds_total in /metrics",
                     SEE_PLUGIN if sglang else "retry once the server has decoded, or pass --probe")
    if sglang:
        try:   # the lease attach takes: timers run only while someone watches
            status, body = http.post_json("/set_internal_state", {"server_args": {"specdecode_timers": LEASE_S}})
            if status != 200:
                return Check("phase timers", MISSING, f"the timer lease was refused (HTTP {status})", SEE_PLUGIN)
        except ServerError as e:
            return Check("phase timers", MISSING, f"the timer lease failed: {e}", SEE_PLUGIN)
    it0, s0 = _progress(http, metrics)
    sender = threading.Thread(target=_one_request, args=(http,), daemon=True) if probe else None
    if sender is not None:
        sender.start()
    deadline = time.monotonic() + max(0.5, wait_s)
    it1, s1 = it0, s0
    while time.monotonic() < deadline:
        time.sleep(0.25)     # polling a remote server's counters (nothing here to wait on)
        m, _ = _metrics(http)
        it1, s1 = _progress(http, m)
        if it1 > it0 and s1 > s0:
            break
    if sender is not None:
        sender.join(timeout=max(1.0, wait_s))
    if not it1 > it0:
        return Check("phase timers", UNKNOWN, f"no decode iterations in {wait_s:g} s to time",
                     "send traffic while it watches, or pass --probe")
    if not s1 > s0:
        return Check("phase timers", MISSING, f"{it1 - it0:.0f} iterations, but the timers stayed at zero",
                     "the hooks do not fire on this SGLang: check the log for `registered 9 hooks` and the "
                     "version note above; SPECDECODE_TIMERS=always keeps them on without a lease")
    return Check("phase timers", OK, f"{it1 - it0:.0f} iterations timed, {1e3 * (s1 - s0):.1f} ms of phases")


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
    if not sglang:
        return Check("live settings", OK, "steps, topk, draft tokens and placement change live")
    adaptive = bool(st.get("speculative_adaptive", raw.get("speculative_adaptive", False)))
    topk = st.get("speculative_eagle_topk", raw.get("speculative_eagle_topk"))
    relaunch = ("launch with --speculative-adaptive --speculative-eagle-topk 1 and an adaptive config that "
                "captures every tier, or let `specdecode-tune launch --pin-steps 1,2,3,4,5 -- ...` write it")
    if not plugin:
        return Check("live steps", MISSING, "needs the plugin", SEE_PLUGIN + "; and " + relaunch)
    if not adaptive or topk not in (1, None):
        return Check("live steps", MISSING, f"adaptive {adaptive}, topk {topk}", relaunch)
    return Check("live steps", OK, "pinned through specdecode_num_steps among the captured tiers")
