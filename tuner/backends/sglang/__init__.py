"""The backend for SGLang 0.5.23: metrics, /server_info and traces always; more with our plugin.

Without our plugin nothing of the speculative setting can change live (SGLang's /set_internal_state
takes only accept thresholds and a few others). With the plugin (`specdecode` entry point), steps
change live through `specdecode_num_steps` when the server runs --speculative-adaptive, and a phase
stream and phase timers exist while a timer lease is held; this backend renews that lease while
attached. topk, num_draft_tokens and the draft's placement always need a relaunch. SGLang answers a
refused change with 200 [false] and says why only in its log, so the steps the plugin can pin (it
publishes them in internal_states, tuner.backends.sglang.pinnable) are checked here first: only
those are offered, a partial one says where it holds, and any other names the slots and the fix.
"""

from __future__ import annotations

from typing import Any, Mapping

from probes.names import ALLREDUCE_PATHS, COLLECTIVES
from tuner.backends.base import PLACEMENT, STEPS, Capabilities
from tuner.backends.common_info import common_info, internal_state, shown
from tuner.backends.http import ServerError
from tuner.backends.live import LiveBackend
from tuner.backends.sglang.pinnable import FLAGS_FIX, Pinnable, parse as parse_pinnable
from tuner.core import setting as vocab

PIN_KEY = "specdecode_num_steps"
TIMERS_KEY = "specdecode_timers"
LEASE_S = 60.0
RENEW_EVERY_S = 20.0
REFUSED_BY_SGLANG = "refused by the server (see its log)"
METRICS_FIX = ("relaunch SGLang with --enable-metrics (and SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 in its "
               "environment for GPU time per graph)")


class SGLangBackend(LiveBackend):
    kind = "sglang"

    def __init__(self, url: str, api_key: str | None = None, **kw: Any) -> None:
        super().__init__(url, api_key, **kw)
        self.plugin: dict[str, Any] | None = None     # GET /specdecode/streams when our plugin is in
        self._plugin_checked = False
        self._lease_at = float("-inf")
        self._started: Any = None                    # the server's startup_time, to see a relaunch
        self.pinnable: Pinnable | None = None        # what the plugin can pin (plugin 2 and later)

    def normalize_info(self, raw: dict[str, Any]) -> dict[str, Any]:
        info = common_info(self.kind, raw)
        st = internal_state(raw)
        info["adaptive"] = bool(st.get("speculative_adaptive", raw.get("speculative_adaptive", False)))
        info["plugin"] = self.plugin
        self.pinnable = parse_pinnable(st)
        # the plugin's all-reduce report and collective counts, for the what-if (server data: kept
        # only when they are objects; readers take every field with .get)
        for key, name in ((ALLREDUCE_PATHS, "allreduce"), (COLLECTIVES, "collectives")):
            if isinstance(st.get(key), dict):
                info[name] = st[key]
        return info

    def check_plugin(self) -> bool:
        """Ask once whether our plugin answers; True when it does."""
        try:
            body = self._http["info"].get_json("/specdecode/streams")
            self.plugin = body if isinstance(body, dict) and body.get("plugin") == "specdecode" else None
        except ServerError:
            self.plugin = None
        self._plugin_checked = True
        return self.plugin is not None

    def after_info(self, now: float) -> None:
        started = self.info.get("startup_time")
        if started != self._started:
            # A new server process (a managed relaunch): it may load the plugin or not, and holds
            # no timer lease yet, so both are asked again now rather than at the next renewal.
            self._started, self._plugin_checked, self._lease_at = started, False, float("-inf")
        if not self._plugin_checked:
            self.check_plugin()
        if self.plugin is not None and now - self._lease_at >= RENEW_EVERY_S:
            # Phase timers cost a little; they run only while someone watches (the lease expires).
            try:
                status, _ = self.take_timer_lease()
                if status == 200:
                    self._lease_at = now
            except ServerError:
                pass

    def take_timer_lease(self) -> tuple[int, Any]:
        """Ask the plugin to run its phase timers for LEASE_S more seconds: (HTTP status, body),
        `[True]` when it took it; ServerError when the request fails."""
        return self._http["info"].post_json("/set_internal_state", {"server_args": {TIMERS_KEY: LEASE_S}})

    @property
    def capabilities(self) -> Capabilities:
        info = self.info
        version = shown(info.get("version", "0.5.23"), 64)
        plugin = self.plugin is not None
        adaptive = bool(info.get("adaptive"))
        def relaunch(what: str, flag: str) -> str:
            # Never str.format a template holding a server string: "{build}" in a version is data.
            return f"SGLang {version} cannot change {what} live: relaunch the server with {flag}"

        # Every knob with a launch flag that SGLang does not take live, but steps (the plugin's,
        # below), needs a relaunch on SGLang.
        reasons = {k.arg: relaunch(k.label, f"{k.launch_flag} N") for k in vocab.knobs()
                   if k.launch_flag and not k.sglang_live and k.arg != STEPS}
        reasons[PLACEMENT] = (f"SGLang {version} has no draft placement setting: the draft runs on the target's "
                              "TP group (a relaunch with attention-DP moves it)")
        if not plugin:
            reasons[STEPS] = (f"SGLang {version} cannot change steps live without the specdecode plugin "
                              "(`pip install --no-deps specdecode-tune` into the server's Python, launch with "
                              "--speculative-adaptive), or relaunch with --speculative-num-steps N")
            reasons["phase_timers"] = "no phase timers: the specdecode plugin is not loaded in this SGLang server"
        elif not adaptive:
            reasons[STEPS] = ("the specdecode plugin changes steps only on a server launched with "
                              "--speculative-adaptive --speculative-eagle-topk 1; or relaunch with "
                              "--speculative-num-steps N; " + FLAGS_FIX.format(steps="1,2,3"))
        pin = self.pinnable if plugin and adaptive else None
        live_values: dict[str, tuple] = {}
        notes: dict[str, dict] = {}
        steps_live = plugin and adaptive
        if pin is not None:
            live_values[STEPS] = pin.allowed
            notes[STEPS] = {s: f"pinned at {where} only" for s, where in pin.partial().items()}
            if not pin.allowed:
                steps_live = False
                reasons[STEPS] = (f"no step tier of this adaptive launch runs at the batch sizes it serves "
                                  f"(slots {pin.slots_text()}); fix: " + FLAGS_FIX.format(steps="1,2,3"))

        def refusal(key: str, value: Any) -> str:
            return pin.refusal(value) if pin is not None and key == STEPS else f"{key} {value} is not settable live"

        missing: tuple[str, ...] = ()
        works = ""
        if self.metrics_missing:
            missing = ("no /metrics (SGLang was launched without --enable-metrics): no server tok/s, acceptance "
                       "gauges or GPU time per graph · fix: relaunch SGLang with --enable-metrics "
                       "(+ SGLANG_ENABLE_METRICS_DEVICE_TIMER=1)",)
            works = ("still works: the load driver's own tok/s and acceptance histograms (l), traces (c), py-spy (y)"
                     + (", the plugin's phase split and live steps" if plugin else ""))
        return Capabilities(
            missing=missing, still_works=works,
            settable=frozenset({k.arg for k in vocab.knobs() if k.sglang_live} | ({STEPS} if steps_live else set())),
            CAN_CAPTURE_TRACE=True, CAN_FETCH_TRACE=False,
            live_values=live_values, value_notes=notes, value_refusal=refusal,
            HAS_PHASE_TIMERS=plugin and self.phase_stream is not False,
            HAS_PHASE_STREAM=bool(self.phase_stream),
            LOCAL_GPUS=self.local_gpus(), reasons=reasons,
            # What a managed relaunch offers is what it then takes: a knob with a launch flag
            # (args.knob_flags) that SGLang does not take live. Placement is not offered: its key
            # moves it off the TP group, which no SGLang 0.5.23 launch does (reasons says so).
            restart_keys=frozenset(k.arg for k in vocab.knobs() if k.launch_flag and not k.sglang_live),
        )

    def metrics_fix(self) -> str | None:
        return METRICS_FIX

    def wire_changes(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        # SGLang's /set_internal_state takes numbers only, and steps go through the plugin's key.
        return {(PIN_KEY if k == STEPS else k): v for k, v in changes.items()}

    def interpret_reply(self, status: int, body: Any) -> tuple[bool, str]:
        if status == 200 and isinstance(body, list) and body and all(x is True for x in body):
            return True, ""
        if status == 200:
            return False, REFUSED_BY_SGLANG
        if isinstance(body, dict):
            err = body.get("error", body.get("detail"))
            if isinstance(err, dict):
                err = err.get("message", err)
            if err:
                return False, f"HTTP {status}: {shown(err)}"
        return False, f"HTTP {status}"
