"""What the commands share: their common flags and parsers, and the one session opener.

With `keys` (the API-key flags) and `duration` (the duration grammar) this is the only module a
command imports from another (an import-linter contract holds the commands independent otherwise).

- Flags: the server URL with the key flags, the load (`--load`, `--rate`, `--prompts`, `--max-new-tokens`)
  and what the TUI's tune key may spend; their parsers (`int_list`, `parse_change`).
- `open_session`: the key, the connection, the recorder, the session and the GPU source, opened in
  that order and closed in reverse, with one error vocabulary: OpenError, one line for people and
  the exit status its cause deserves (2: the command's own inputs, such as the key file or the
  recording's path; 1: the server).

Must not print but through `fail` (the command says an OpenError its own way); the TUI's app is
imported only inside `run_tui`.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from tuner.backends.load import builtin_prompts
from tuner.commands.keys import ApiKeyError, add_key_arguments, api_key_of

__all__ = ["MAX_STEPS_BOUND", "TUI_GPUS_EVERY_S", "OpenError", "Opened", "add_load_arguments", "add_objective_arguments", "add_server_arguments",
           "add_tui_tune_arguments", "api_key", "builtin_prompts", "fail", "gpu_labels", "int_list", "objective_of",
           "open_session", "parse_change", "placement_list", "prompts_for", "run_fleet", "run_tui", "start_nvml", "tui_inputs"]

MAX_STEPS_BOUND = 64
RATE_CAP = 64
"""Requests in flight at most under `--rate` without `--load` (bench_serving's --max-concurrency)."""
"""The deepest chain `tune --max-steps` and the TUI's `--tune-max-steps` accept (one bound for both:
the search space, and the cost of every probe, grow with it)."""

TUI_GPUS_EVERY_S = 0.1
"""How often the TUI's GPU panel reads NVML (`record` has --nvml-hz)."""


# -- flags ----------------------------------------------------------------------------------------------

def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's URL and the key flags (tuner.commands.keys)."""
    parser.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:30000")
    add_key_arguments(parser)


def add_load_arguments(parser: argparse.ArgumentParser, tui: bool = True) -> None:
    """--load, --rate, --prompts, --max-new-tokens; tui: the TUI's l key toggles the load (said in --help)."""
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="keep N generate requests in flight from the start"
                             + (" (l toggles it)" if tui else "") + "; with --rate: at most N in flight")
    parser.add_argument("--rate", type=request_rate, default=None, metavar="R", action=_RateAction,
                        help="open loop: Poisson arrivals of R requests/s, as bench_serving --request-rate "
                             f"(at most --load in flight, {RATE_CAP} without it)")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL prompts for the load ({\"text\": ...} per line; default: built-in)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per load request")


def add_tui_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """What the TUI's tune key (`u`) may spend and search (the `tune` command has its own flags)."""
    parser.add_argument("--tune-budget", default="120s", metavar="D",
                        help="time the tune key's tuner may take (e.g. 90s, 5m; default 120s)")
    parser.add_argument("--tune-max-steps", type=int, default=5, metavar="N",
                        help="deepest chain the tune key considers (default 5)")
    parser.add_argument("--tune-topk", default="1", metavar="K,...",
                        help="topk values the tune key considers, e.g. 1,4 (trees also need --tune-draft-tokens)")
    parser.add_argument("--tune-draft-tokens", default="", metavar="N,...",
                        help="num_draft_tokens values for the tune key's trees, e.g. 8,16")
    from tuner.tuning.slo import OBJECTIVES
    parser.add_argument("--tune-objective", choices=OBJECTIVES, default="throughput",
                        help="what the tune key optimises: throughput (highest tok/s) or latency (lowest p99 ITL)")
    parser.add_argument("--tune-slo", default=None, metavar="TERMS",
                        help="the tune key's SLO: highest tok/s subject to e.g. 'itl_p99<=40ms' "
                             "(ttft, queue and e2e terms are judged only under --rate)")


class _RateAction(argparse.Action):
    """--rate without --load drives a load of up to RATE_CAP in flight (a later --load still wins)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        if not getattr(namespace, "load", 0):
            namespace.load = RATE_CAP


def add_objective_arguments(parser: argparse.ArgumentParser) -> None:
    """--objective and --slo (tuner.tuning.slo); the TUI's tune key takes the same."""
    from tuner.tuning.slo import OBJECTIVES
    parser.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                        help="throughput (highest tok/s) or latency (lowest p99 inter-token latency)")
    parser.add_argument("--slo", default=None, metavar="TERMS",
                        help="highest tok/s subject to e.g. 'itl_p99<=40ms,ttft_p99<=2s' "
                             "(ttft, queue and e2e terms are judged only under --rate)")


def objective_of(args: argparse.Namespace):
    """The Objective of --objective/--slo/--rate; SloError (one line) when the SLO does not parse."""
    from tuner.tuning.slo import Objective, parse_slo
    return Objective(args.objective, parse_slo(args.slo) if args.slo else (), open_loop=bool(args.rate))


# -- parsers --------------------------------------------------------------------------------------------

def request_rate(text: str) -> float:
    """--rate's value: requests per second, a positive finite number."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"--rate wants requests per second (a positive number), got {text!r}")
    return v


def int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if any(v < 1 for v in out):
        raise argparse.ArgumentTypeError("values must be >= 1")
    return out


def placement_list(text: str) -> list[str]:
    from tuner.tuning.settings import PLACEMENTS
    out = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in PLACEMENTS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"placements are {', '.join(PLACEMENTS)} (got {text!r})")
    return out


def parse_change(text: str, flag: str = "--set") -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, int | float | str): the one grammar of --set, --set-at and --try."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{flag} wants KEY=VALUE, got {text!r}")
    for conv in (int, float):
        try:
            return key.strip(), conv(value)
        except ValueError:
            pass
    return key.strip(), value.strip()


def prompts_for(args: argparse.Namespace) -> list[dict]:
    """The --prompts file, else the built-in prompts; a bad file raises ValueError with one line."""
    from tuner.backends.load import load_prompts
    return load_prompts(args.prompts) if args.prompts else builtin_prompts()


def tui_inputs(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """(prompts, make_app's tune_* keywords) from attach's and demo's flags; OpenError (rc 2)."""
    from tuner.commands.duration import parse_duration

    try:
        prompts = prompts_for(args)
    except (OSError, ValueError) as e:
        raise OpenError(f"prompts: {e}", 2) from None
    try:
        budget = parse_duration(args.tune_budget)
    except ValueError as e:
        raise OpenError(f"--tune-budget: {e}", 2) from None
    if not 1 <= args.tune_max_steps <= MAX_STEPS_BOUND:
        raise OpenError(f"--tune-max-steps must be between 1 and {MAX_STEPS_BOUND}", 2)
    lists = {}
    for flag, text in (("--tune-topk", args.tune_topk), ("--tune-draft-tokens", args.tune_draft_tokens)):
        try:
            lists[flag] = tuple(int_list(text))
        except argparse.ArgumentTypeError as e:
            raise OpenError(f"{flag}: {e}", 2) from None
    from tuner.tuning.slo import Objective, SloError, parse_slo
    rate = getattr(args, "rate", None)
    try:
        objective = Objective(args.tune_objective, parse_slo(args.tune_slo) if args.tune_slo else (),
                              open_loop=bool(rate))
    except SloError as e:
        raise OpenError(f"--tune-slo: {str(e).removeprefix('--slo: ')}", 2) from None
    return prompts, {"tune_budget_s": budget, "tune_max_steps": args.tune_max_steps,
                     "tune_topks": lists["--tune-topk"] or (1,), "tune_draft_tokens": lists["--tune-draft-tokens"],
                     "tune_objective": objective}


# -- the session opener ------------------------------------------------------------------------------------

class OpenError(Exception):
    """Why a command could not open its session: one line for people (never the key), and `rc`,
    the exit status its cause deserves (2: the command's own inputs; 1: the server)."""

    def __init__(self, text: str, rc: int) -> None:
        super().__init__(text)
        self.rc = rc


def fail(prog: str, error: Any, rc: int | None = None) -> int:
    """Say `specdecode-tune PROG: ERROR` on stderr (terminal-safe: server text is data); the status."""
    from tuner.core.text import terminal_safe

    print(terminal_safe(f"specdecode-tune {prog}: {error}"), file=sys.stderr)
    return rc if rc is not None else getattr(error, "rc", 1)


def api_key(args: argparse.Namespace) -> str | None:
    """The key the command sends (its flags, else $SPECDECODE_API_KEY); OpenError(rc 2) when bad."""
    try:
        return api_key_of(args)
    except ApiKeyError as e:
        raise OpenError(str(e), 2) from None


@dataclass
class Opened:
    """What `open_session` opened; the session owns the backend and the recorder."""

    backend: Any
    session: Any
    recorder: Any
    sampler: Any
    api_key: str | None

    @property
    def gpu_labels(self) -> dict[int, str]:
        return gpu_labels(self.sampler)


_FROM_ARGS: Any = object()


@contextmanager
def open_session(args: argparse.Namespace, url: str | None = None, *, key: str | None = _FROM_ARGS,
                 kind: str | None = None, check: Callable[[Any], None] | None = None,
                 record: Path | None = None, header: dict | None = None, overwrite: bool = False,
                 store: Any = None, start: bool = False, gpus_every_s: float | None = None) -> Iterator[Opened]:
    """Open what a command needs, in order, and close it all on the way out, however it ends.

    url: the server (default args.url); key: an already-resolved key (default: from args);
    kind: skip the server-kind detection; check(backend): may refuse the server with OpenError
    before anything is recorded; record: the recording's path (header_for(backend, **header));
    store: the session's store; start: start the pollers now (the TUI starts its own);
    gpus_every_s: NVML readings of this host's GPUs at that interval (None: no GPU source). A
    recording with a GPU source names its GPUs in its header.
    Raises OpenError before yielding; nothing is left open then.
    """
    from tuner.backends import ServerError, connect
    from tuner.core.session import Session

    key = api_key(args) if key is _FROM_ARGS else key
    try:
        backend = connect(url or args.url, api_key=key, kind=kind)
    except ServerError as e:
        raise OpenError(str(e), 1) from None
    recorder = None
    try:
        if check is not None:
            check(backend)
        if record is not None:
            from tuner.recording import Recorder, header_for
            try:
                recorder = Recorder(record, header_for(backend, **(header or {})), overwrite=overwrite)
            except Exception as e:  # noqa: BLE001 - RecordingError, OSError: one line either way
                raise OpenError(f"cannot record to {record}: {e}", 2) from None
    except BaseException:
        backend.stop()
        raise
    session = Session(backend, recorder=recorder, store=store)
    if getattr(args, "rate", None):
        session.load_defaults["rate"] = args.rate      # every start of the load, the TUI's l key's too
    sampler = None
    try:
        if start:
            session.start()
        sampler = start_nvml(session, gpus_every_s) if gpus_every_s else None
        if sampler is not None and recorder is not None:
            labels = gpu_labels(sampler)
            recorder.set_header("gpus", [{"index": d.index, "name": d.name, "bus_id": d.bus_id, "uuid": d.uuid,
                                          "rank": d.rank, "label": labels.get(d.index)} for d in sampler.devices])
        yield Opened(backend, session, recorder, sampler, key)
    finally:
        if sampler is not None:
            sampler.stop()
        session.close()


def run_tui(opened: Opened, load: int, prompts: list[dict], tune: dict, max_new_tokens: int = 128,
            **app: Any) -> int:
    """Run the TUI over an opened session until the operator quits (the opener closes it)."""
    from tuner.app import make_app

    make_app(opened.session, load=load, prompts=prompts, max_new_tokens=max_new_tokens,
             gpu_labels=opened.gpu_labels, **tune, **app).run()
    return 0


def run_fleet(poller: Any, view: Callable[[Any], Any]) -> int:
    """The fleet screen until it quits (status 0); enter runs `view(session)` on that member's session
    (the single-server view, live or replayed), then the fleet screen again."""
    from tuner.screens.fleet import FleetApp

    with poller:
        while True:
            name = FleetApp(poller).run()
            if name is None:
                return 0
            session = poller.session(name)
            if session is None:
                continue                     # not connected (any more): its row says why
            try:
                view(session)
            finally:
                poller.give_back(name, closed=True)     # the view closed the session on its way out


def start_nvml(session: Any, interval_s: float = 0.1) -> Any:
    """NVML readings of this host's GPUs onto the session's bus every `interval_s`, when the
    server's GPUs are here.

    Returns the started sampler, or None: a host without NVML (or a server elsewhere) gets no
    readings, which the GPU panel explains; that is not an error.
    """
    from probes.nvml import NvmlSampler
    from tuner.core.records import Sample

    backend = session.backend
    if backend is None or backend.READ_ONLY or not backend.LOCAL_GPUS:
        return None
    sampler = NvmlSampler(lambda t, series, value: session.put(Sample(t, series, value)), session.clock,
                          interval_s=interval_s, rank_info=backend.rank_info)
    if not sampler.available:
        return None
    sampler.start()
    return sampler


def gpu_labels(sampler: Any) -> dict[int, str]:
    """`H200 r0` per GPU index: the short device name and the server rank on it, when known."""
    if sampler is None:
        return {}
    out = {}
    for d in sampler.devices:
        name = d.name.replace("NVIDIA ", "").split()[0] if d.name else ""
        out[d.index] = f"{name} r{d.rank}" if d.rank is not None else name
    return out
