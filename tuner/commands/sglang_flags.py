"""`specdecode-tune sglang-flags --from URL|FILE --steps 1,2,3 [--config FILE] [--out adaptive.json]`:
the SGLang launch in which those step tiers can be pinned live at every batch size.

Reads a running server's `/server_info` (or a saved one), writes the adaptive config (one writer:
probes/adaptive_policy.write_config) and prints the flags to relaunch with, where each tier can be
pinned before and after, the CUDA graphs it adds, the graph memory scaled from the server's own
figures, and how SGLang's own controller changes (`--freeze-policy` turns it off). The arithmetic is
tuner/backends/sglang/flags.py. Writes only the --out file; never changes the server.
Exit status: 0 written, 1 the launch cannot be planned, 2 unreachable server or bad arguments.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tuner.commands.options import fail
from tuner.core.text import terminal_safe

def _steps(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected steps like 1,2,3, got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 0, got {text!r}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tuner.commands.keys import add_key_arguments

    p.add_argument("--from", dest="source", required=True, metavar="URL|FILE",
                   help="a running SGLang server, or a saved /server_info JSON")
    p.add_argument("--steps", type=_steps, required=True, metavar="1,2,3",
                   help="the step tiers to pin live at every batch size")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="the launch's --speculative-adaptive-config, when it exists only on the server "
                        "and the server's plugin does not publish its tiers")
    p.add_argument("--out", type=Path, default=Path("adaptive.json"), metavar="FILE",
                   help="where to write the config (default adaptive.json)")
    p.add_argument("--freeze-policy", action="store_true",
                   help="warmup_batches 1e9 in every slot: SGLang's controller never moves a tier, only pins do")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_key_arguments(p)


def _say(text: str) -> None:
    print(terminal_safe(text))


def _server_info(args: argparse.Namespace) -> dict:
    src = args.source
    if src.startswith(("http://", "https://")):
        from tuner.backends.http import HttpClient
        from tuner.commands.keys import api_key_of

        http = HttpClient(src, api_key_of(args))
        try:
            raw = http.get_json("/server_info")
        finally:
            http.close()
    else:
        from probes.json_file import read_json

        raw = read_json(src)            # JsonFileError (a ValueError): one line naming the file
    if not isinstance(raw, dict):
        raise ValueError("the server info is not a JSON object")
    return raw


def run(args: argparse.Namespace) -> int:
    from probes.adaptive_policy import AdaptiveConfigError, parse_config
    from probes.json_file import read_json
    from tuner.backends.http import ServerError
    from tuner.backends.sglang.flags import FlagsError, explain, launch_of, plan
    from tuner.recording.outputs import OutputError, write_text

    try:
        raw = _server_info(args)
    except (ServerError, ValueError, OSError) as e:        # ApiKeyError is a ValueError
        return fail("sglang-flags", str(e), 2)
    try:
        config = parse_config(read_json(args.config)) if args.config is not None else None
        lau = launch_of(raw, config)
        p = plan(lau, args.steps, str(args.out), args.freeze_policy)
    except (FlagsError, AdaptiveConfigError) as e:
        return fail("sglang-flags", str(e), 1)
    except ValueError as e:                                # the --config file (JsonFileError)
        return fail("sglang-flags", str(e), 2)
    try:
        write_text(args.out, json.dumps(p.config, indent=2) + "\n")
    except OutputError as e:
        return fail("sglang-flags", f"--out: {e}", 1)
    if args.json:
        print(json.dumps({"config": p.config, "flags": p.flags, "out": str(args.out),
                          "graphs_before": p.graphs_before, "graphs_after": p.graphs_after,
                          "added_by_tier": {str(k): v for k, v in p.added_by_tier.items()},
                          "memory_gb": p.memory_gb,
                          "pinnable_before": {str(k): v for k, v in p.before.items()},
                          "pinnable_after": {str(k): v for k, v in p.after.items()}}, indent=1))
        return 0
    for line in explain(p, args.steps, args.freeze_policy):
        _say(line)
    _say(f"wrote {args.out}; copy it to the server and relaunch with (replacing any of these flags):")
    _say("  " + " ".join(p.flags))
    return 0
