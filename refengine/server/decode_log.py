"""SGLang 0.5.23's decode log line, character for character (reference §8).

Formatting only; the numbers come from phase_stats.Window. Must not compute statistics itself.
"""

from __future__ import annotations

import time


def prefix(tp_rank: int, tp_size: int) -> str:
    # SGLang adds " TP{t}" only when the TP size is above 1 (DP/PP/EP parts never apply here).
    return f" TP{tp_rank}" if tp_size > 1 else ""


def timestamp(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() if now is None else now))


def decode_line(*, running: int, tokens: int, token_usage: float, speculative: bool,
                accept_len: float, accept_rate: float, device: str, gen_throughput: float,
                queued: int, graph: bool = False) -> str:
    msg = f"Decode batch, #running-req: {running}, #token: {tokens}, token usage: {token_usage:.2f}, "
    if speculative:
        msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
    kind = "cuda graph" if device == "cuda" else "cpu graph"
    # True only when the decode phases replay CUDA graphs (never on CPU).
    msg += f"{kind}: {graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queued}"
    return msg


def log_line(message: str, tp_size: int, now: float | None = None) -> str:
    return f"[{timestamp(now)}{prefix(0, tp_size)}] {message}"
