"""Trace capture into a session: capture on every rank, analyse, and put the result on the bus.

The one implementation behind the TUI's capture key and `record --capture-trace-every`: the
instruments (probes.capture, probes.trace_analysis) do the work, this glue turns the rank files and
the analysis into `Trace` records (the analysis rides on rank 0's) and a `trace_captured` event, so
the store, a recording and the report all see the capture the same way; the rank files stay in a
folder named by the capture's id, for Perfetto. No textual; it blocks for the capture's length, so
callers run it off their ticking thread.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tuner.core.events import EventKind
from tuner.core.records import Event, Trace

Progress = Callable[[str, "float | None"], None]


TRACE_DIR_ENV = "SPECDECODE_TRACE_DIR"
"""Where captures keep their rank files (one folder per capture, named by its id); by default a
folder of this user's in the system's temporary directory."""


@dataclass(frozen=True)
class Captured:
    trace_id: str
    files: tuple[str, ...]
    seconds: float
    analysis: dict[str, Any] | None      # None when the analysis failed (see analysis_error)
    analysis_error: str = ""
    folder: str = ""
    """Where the rank files are kept, to open in Perfetto (ui.perfetto.dev); "" when they could not be."""


def traces_dir() -> Path:
    """The folder each capture's own folder goes in ($SPECDECODE_TRACE_DIR, else a private one in
    the system's temporary directory)."""
    chosen = os.environ.get(TRACE_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return Path(tempfile.gettempdir()) / f"specdecode-tune-traces-{os.getuid()}"


def _keep(files: list[Path], folder: Path) -> str:
    """Move the rank files into `folder`; its path, or "" (the bytes are in the records anyway)."""
    try:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        for f in files:
            shutil.move(str(f), folder / f.name)
    except OSError:
        return ""
    return str(folder)


def capture_into(session: Any, num_steps: int = 5, timeout_s: float = 120.0,
                 progress: Progress | None = None, keep_in: Path | None = None) -> Captured:
    """Capture `num_steps` iterations on every rank of the session's server and record them.

    Raises probes.capture.CaptureError (one line) when the capture itself fails; an analysis that
    fails keeps the traces, with the error in the event and in `Captured.analysis_error`.
    `progress(text, fraction or None)` is called from this thread as the capture moves on. The rank
    files stay in `keep_in` (default traces_dir()) / the capture's id; the event names the folder.
    """
    from probes.capture import TraceCapture
    from probes.trace_analysis import TraceAnalysisError, analyze_paths

    def on_progress(p: Any) -> None:
        if progress is not None:
            progress(p.message, p.files_ready / p.files_expected if p.files_expected else None)

    backend = session.backend
    dest = Path(tempfile.mkdtemp(prefix="specdecode-trace-"))
    try:
        cap = TraceCapture(backend.url, api_key=getattr(backend, "api_key", None), on_progress=on_progress)
        try:
            result = cap.capture(dest, num_steps=num_steps, timeout_s=timeout_s)
        finally:
            cap.close()
        if progress is not None:
            progress(f"analysing {len(result.files)} rank file(s)…", None)
        analysis: dict[str, Any] | None = None
        error = ""
        try:
            analysis = analyze_paths(result.files).to_dict()
        except (TraceAnalysisError, OSError, ValueError) as e:
            error = str(e).splitlines()[0] if str(e) else type(e).__name__
        except Exception as e:   # noqa: BLE001 - a server's trace is data: a bug it trips is an analysis error
            error = f"analysis failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        now = session.now()
        for rank, path in enumerate(result.files):
            session.put(Trace(now, result.profile_id, rank, path.name, path.read_bytes(),
                              analysis if rank == 0 else None))
        data: dict[str, Any] = {"trace_id": result.profile_id, "files": [p.name for p in result.files],
                                "ranks": len(result.files), "seconds": round(result.seconds, 3),
                                "mode": analysis.get("mode") if analysis else None}
        if error:
            data["analysis_error"] = error
        # The bytes are in the Trace records; the files stay too, named, for Perfetto.
        folder = _keep(list(result.files), (keep_in or traces_dir()) / _safe(result.profile_id))
        if folder:
            data["folder"] = folder
            if analysis is not None:
                # For a later command on this server (once, the fleet row): the draft's collective
                # share with its wall-clock time, since SGLang's plugin cannot time those collectives.
                import time

                from tuner.core.trace_share import save
                save(Path(folder), backend.url, analysis, time.time(), result.profile_id)
        session.put(Event(now, EventKind.TRACE_CAPTURED, data))
        return Captured(result.profile_id, tuple(p.name for p in result.files), result.seconds,
                        analysis, error, folder)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _safe(name: str) -> str:
    # A server names the capture: never a path, whatever it sends.
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name)).strip(".")
    return cleaned or "capture"
