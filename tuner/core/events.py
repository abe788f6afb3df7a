"""The event kinds every part agrees on, with the keys each one's data carries.

Only names live here; producing them is the job of backends, samplers and the session. Other parts
may add kinds (prefix them with their area, e.g. ``nvml_unavailable``); readers must ignore kinds they
do not know.
"""

from __future__ import annotations


class EventKind:
    """Event kinds (Event.kind). The data keys are listed beside each."""

    CONNECTED = "connected"
    """The server answers (again). data: url, backend, after_s (seconds it was away, 0 at first)."""
    DISCONNECTED = "disconnected"
    """The server stopped answering. data: url, since (session time), error (one line)."""
    DEGRADED = "degraded"
    """The server answers, but an endpoint did not answer in full before its deadline (a slow or
    trickling server). data: url, since, endpoint, reason (one line). A later CONNECTED (after_s 0,
    was "degraded") ends it."""
    POLL_ERROR = "poll_error"
    """An endpoint answered with something unusable (HTML, 500, garbage, too large) or not in time.
    data: endpoint, error."""
    SERVER_INFO = "server_info"
    """Server identity at connect or after a relaunch. data: kind, version, model, tp_size,
    launch (top-level /server_info args), active (internal_states[0] knobs), capabilities."""
    CONFIG_CHANGED = "config_changed"
    """The server runs a new active configuration from this time on (the A/B change point).
    data: old, new (dicts of knob -> value), epoch (or None), source ("phase_stream"|"server_info"|"metrics")."""
    CONFIG_ACTIVE = "config_active"
    """The server's read-back of its active configuration changed (views update at once; the A/B
    change point stays CONFIG_CHANGED). data: active."""
    CONFIG_REQUESTED = "config_requested"
    """The operator (or tuner) asked for a change. data: changes, by."""
    CONFIG_APPLIED = "config_applied"
    """The server accepted a requested change. data: changes, reply."""
    CONFIG_REFUSED = "config_refused"
    """The server (or the backend, before sending) refused a change. data: changes, reason."""
    LOAD_STARTED = "load_started"
    """The load driver started. data: concurrency, prompts, max_new_tokens."""
    LOAD_STOPPED = "load_stopped"
    """The load driver stopped. data: requests, tokens, errors."""
    LOAD_ERROR = "load_error"
    """A load request failed. data: error (one line). Repeats of one error are folded."""
    LOAD_REQUEST = "load_request"
    """One load request reached [DONE] (not shown in the event log). data: sent, ttft, e2e, tokens,
    gaps ([[seconds, new tokens], ...] per later output), queue (when the server says), wait (open
    loop: time it waited for a free slot); tuner.core.latency.RequestTiming."""
    LATENCY_BUCKETS = "latency_buckets"
    """The server's latency histograms moved between two /metrics scrapes (not shown in the event
    log). data: {ttft|itl|e2e|queue: [[le, n], ...]}, the non-zero per-bucket deltas."""
    LATENCY_UNAVAILABLE = "latency_unavailable"
    """The server's latency histograms cannot be read. data: reason (one line)."""
    PHASE_GAP = "phase_gap"
    """The phase stream reader missed records. data: dropped."""
    TRACE_CAPTURED = "trace_captured"
    """A profiler capture finished. data: trace_id, files, ranks, (analysis summary)."""
    RELAUNCH_STARTED = "relaunch_started"
    """Managed mode stops the server to start it with a rewritten command.
    data: changes, command (shell-quoted, secrets redacted), previous."""
    RELAUNCH_READY = "relaunch_ready"
    """The relaunched server is ready. data: changes, command, seconds."""
    RELAUNCH_FAILED = "relaunch_failed"
    """The new command did not come up. data: changes, command, error (one line)."""
    RELAUNCH_ROLLED_BACK = "relaunch_rolled_back"
    """After a failed relaunch the previous command runs again. data: command."""
    ADAPTIVE_TIER = "adaptive_tier"
    """SGLang's adaptive policy moved a slot's steps (its log line, managed mode).
    data: old_steps, new_steps, ema_accept_len."""
    NOTE = "note"
    """Free text from the operator or a tool. data: text."""
    RECORDING_GAP = "recording_gap"
    """Written by readers for records they could not read. data: reason."""
    CONTROLLER_CHECK = "controller_check"
    """SGLang's adaptive controller checked against the tuner's cost model
    (tuner.tuning.controller_check's JSON: source, approximate, placement, rows, overall, note)."""


TUNING_PREFIX = "tuning_"


class TuningKind:
    """The events the live tuner (tuner.tuning.live) puts on the bus; the data keys beside each."""

    STARTED = "tuning_started"        # space, probes, budget_s, initial
    PROBE = "tuning_probe"            # setting, purpose, n, tok_s, terms_ms
    PREDICTION = "tuning_prediction"  # bs, best, predictions, model
    APPLIED = "tuning_applied"        # setting, predicted_tok_s, sd, incumbent, predicted_gain
    VERIFIED = "tuning_verified"      # setting, incumbent, verdict, ratio, lo, hi, predicted_ratio, windows, series
    ROLLED_BACK = "tuning_rolled_back"  # setting, to, reason
    REFUSED = "tuning_refused"        # setting, reason
    FINISHED = "tuning_finished"      # result (TuningResult.to_json())
    PROBLEM = "tuning_problem"        # message


TUNING_KINDS: tuple[str, ...] = tuple(v for k, v in vars(TuningKind).items() if k.isupper())
"""Every kind the tuner emits: what the tune screen, `tune` and a replay read back."""


# Events after which the before/after comparison restarts its sides (see tuner.core.ab). A
# disconnect/reconnect is not one: the outage and the settling after it are left out of both sides.
AB_BOUNDARY_KINDS = frozenset({
    EventKind.CONFIG_CHANGED, EventKind.LOAD_STARTED, EventKind.LOAD_STOPPED,
})
