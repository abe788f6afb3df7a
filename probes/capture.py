"""Capture a torch-profiler trace on every rank of a running server through `/start_profile`.

SGLang (and our engine) answer `/start_profile` at once and, with `num_steps`, stop by themselves
after that many scheduler steps with no notification (reference §1.8): every rank then writes
`{profile_id}-TP-{rank}.trace.json.gz` into `output_dir` on the server's host. So the capture:

1. reads `tp_size` (× `pp_size`) from `/server_info` — that many files will come;
2. POSTs `/start_profile` with `num_steps`, `output_dir`, `profile_id`, `with_stack=false` and
   `record_shapes=false` by default (both are costly and SGLang turns them on unless told);
3. local server: waits until every rank's file exists and its size has stopped changing;
   remote server: polls our engine's `GET /specdecode/traces` and downloads each file by name
   from `GET /specdecode/traces/{name}` (names are checked against SGLang's pattern, never used
   as paths as sent).

Progress goes to a plain callable (the headless core puts it on its bus). This module must not
import tuner, start processes, or build a path or command from server-sent text unchecked.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

# SGLang: `{prefix-}{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}][-EP-{ep}][-{EXTEND|DECODE}].trace.json.gz`
TRACE_NAME = re.compile(r"^(?P<profile_id>[A-Za-z0-9][A-Za-z0-9._-]*?)-TP-(?P<rank>\d+)"
                        r"(?:-DP-\d+)?(?:-PP-\d+)?(?:-EP-\d+)?(?:-(?:EXTEND|DECODE))?\.trace\.json\.gz$")
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
# Trace downloads are legitimately tens to hundreds of MB per rank: a generous cap, and the disk must
# keep this much free after each file (a full disk breaks the recording too).
MAX_TRACE_BYTES = 2 * 1024**3
MIN_FREE_BYTES = 256 * 1024**2
MAX_LISTING_BYTES = 4 * 1024**2


class CaptureError(RuntimeError):
    """A capture that could not finish; the message is one line saying what to do."""


@dataclass(frozen=True)
class CaptureProgress:
    """One step of a capture, for the bus: `stage` is starting | waiting | downloading | done | failed."""

    stage: str
    profile_id: str
    files_ready: int
    files_expected: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CaptureResult:
    profile_id: str
    files: list[Path]
    """Local paths of the rank files, ordered by rank."""
    remote: bool
    """True when the files were downloaded from the server's host."""
    server_dir: str | None
    """The output_dir asked of the server (a path on the server's host), if any."""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def is_loopback(base_url: str) -> bool:
    """True when the URL's host is this machine's loopback (then the server writes files we can see)."""
    host = urlsplit(base_url).hostname or ""
    return host in _LOOPBACK or host.startswith("127.")


class TraceCapture:
    """Capture traces from one server.

    Example:
        cap = TraceCapture("http://127.0.0.1:30000", on_progress=print)
        result = cap.capture(num_steps=5, dest=Path("traces"))
        analysis = probes.trace_analysis.analyze_paths(result.files)

    Args:
        base_url: the server's URL.
        api_key: sent as `Authorization: Bearer ...` (SGLang's --api-key / our engine's).
        remote: True to download through `/specdecode/traces` (server on another host), False to
            wait for files in a directory shared with the server, None to decide by the URL's host.
        on_progress: called with a CaptureProgress at each step, from the capturing thread.
        client, sleep, clock: injectable for tests (a real httpx.Client over a real socket).
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, remote: bool | None = None,
                 on_progress: Callable[[CaptureProgress], None] | None = None,
                 client: httpx.Client | None = None, poll_s: float = 0.25,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.Client(base_url=self.base_url, headers=headers, timeout=30.0)
        self.remote = (not is_loopback(base_url)) if remote is None else remote
        self._on_progress = on_progress
        self._poll_s = poll_s
        self._sleep = sleep
        self._clock = clock

    def close(self) -> None:
        self._client.close()

    # -- the capture ----------------------------------------------------------------------------
    def capture(self, dest: str | Path, *, num_steps: int = 5, output_dir: str | None = None,
                with_stack: bool = False, record_shapes: bool = False, profile_id: str | None = None,
                activities: list[str] | None = None, timeout_s: float = 120.0) -> CaptureResult:
        """Start a `num_steps` capture and return the rank files, local under `dest`.

        For a local server `output_dir` defaults to `dest` (the server writes there directly);
        for a remote one it defaults to the server's own choice and files are downloaded to `dest`.
        """
        if num_steps < 1:
            raise CaptureError(f"num_steps must be >= 1, got {num_steps}")
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        pid = profile_id or f"specdecode-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", pid):
            raise CaptureError(f"profile_id {pid!r} may hold only letters, digits, '.', '_' and '-'")
        expected = self._expected_files()
        server_dir = output_dir if (output_dir or self.remote) else str(dest.resolve())
        body: dict[str, Any] = {"num_steps": num_steps, "with_stack": with_stack,
                                "record_shapes": record_shapes, "profile_id": pid}
        if server_dir:
            body["output_dir"] = server_dir
        if activities:
            body["activities"] = activities
        t0 = self._clock()
        self._progress("starting", pid, 0, expected, f"starting a {num_steps}-step capture on {expected} rank(s)")
        self._post_start(body)
        try:
            if self.remote:
                files = self._download_when_ready(pid, expected, dest, t0 + timeout_s)
            else:
                files = self._wait_local(pid, expected, Path(server_dir), t0 + timeout_s, num_steps)
        except CaptureError as e:
            self._progress("failed", pid, 0, expected, str(e))
            raise
        secs = self._clock() - t0
        self._progress("done", pid, len(files), expected, f"{len(files)} trace file(s) in {secs:.1f} s")
        return CaptureResult(profile_id=pid, files=files, remote=self.remote, server_dir=server_dir, seconds=secs)

    # -- steps ----------------------------------------------------------------------------------
    def _expected_files(self) -> int:
        info = self._get_json("/server_info")
        def size(key: str) -> int:
            v = info.get(key, 1)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1
        return size("tp_size") * size("pp_size")

    def _post_start(self, body: dict[str, Any]) -> None:
        try:
            r = self._client.post("/start_profile", json=body)
        except httpx.HTTPError as e:
            raise CaptureError(f"{self.base_url}: cannot start the profiler ({type(e).__name__}: {e})") from None
        if r.status_code != 200:
            raise CaptureError(f"/start_profile refused ({r.status_code}): {_one_line(r.text)}")

    def _wait_local(self, pid: str, expected: int, directory: Path, deadline: float, num_steps: int) -> list[Path]:
        last: dict[Path, int] = {}
        while True:
            found = sorted(p for p in directory.glob(f"*{pid}-TP-*.trace.json.gz") if _is_capture_file(p.name, pid))
            sizes = {p: _size(p) for p in found}
            # The exporter writes the gzip in place, so existence is not completion: a file is done
            # when its size held since the previous poll and its gzip stream reaches its end marker.
            stable = [p for p in found if sizes[p] > 0 and last.get(p) == sizes[p] and gzip_complete(p)]
            self._progress("waiting", pid, len(stable), expected, f"{len(stable)}/{expected} rank files written")
            if len(stable) >= expected:
                return sorted(stable, key=_rank_of)
            if self._clock() > deadline:
                raise CaptureError(
                    f"only {len(stable)} of {expected} rank files in {directory} after the timeout; a "
                    f"{num_steps}-step capture ends only after {num_steps} scheduler steps: is the server decoding?"
                    + ("" if found or directory.exists() else " (is the server on another host? use remote)"))
            last = sizes
            self._sleep(self._poll_s)

    def _download_when_ready(self, pid: str, expected: int, dest: Path, deadline: float) -> list[Path]:
        last: dict[str, int] = {}
        while True:
            listing = self._get_json("/specdecode/traces", hint=" (only our engine serves trace files; "
                                     "for SGLang on another host copy them from its output_dir)")
            mine = _listed_files(listing, pid)
            ready = sorted((n for n, size in mine.items() if size > 0 and last.get(n) == size),
                           key=lambda n: int(TRACE_NAME.match(n).group("rank")))
            last = mine
            self._progress("waiting", pid, len(ready), expected, f"{len(ready)}/{expected} rank files on the server")
            if len(ready) >= expected:
                got = []
                for name in ready:
                    self._progress("downloading", pid, len(got), expected, f"downloading {name}")
                    path = self._download(name, dest / name, deadline)
                    if not gzip_complete(path):  # still being written on the server: list again later
                        path.unlink(missing_ok=True)
                        break
                    got.append(path)
                if len(got) >= expected:
                    return got
            if self._clock() > deadline:
                raise CaptureError(f"only {len(ready)} of {expected} complete rank files on the server after "
                                   "the timeout: is the server decoding?")
            self._sleep(self._poll_s)

    def _download(self, name: str, target: Path, deadline: float | None = None) -> Path:
        """One rank file to `target`, at most MAX_TRACE_BYTES, leaving MIN_FREE_BYTES on the disk,
        ending by `deadline` (the capture's): CaptureError otherwise, and no partial file left."""
        partial = target.with_name(target.name + ".part")
        try:
            with self._client.stream("GET", f"/specdecode/traces/{quote(name, safe='')}",
                                     headers={"Accept-Encoding": "identity"}) as r:
                if r.status_code != 200:
                    raise CaptureError(f"download of {name} refused ({r.status_code}): "
                                       f"{_one_line(_capped(r, 4096).decode(errors='replace'))}")
                declared = r.headers.get("content-length", "")
                size = int(declared) if declared.isdigit() else 0
                if size > MAX_TRACE_BYTES:
                    raise CaptureError(f"{name} is {size} bytes, over the {MAX_TRACE_BYTES >> 30} GiB cap per rank file")
                _check_free(target.parent, size)
                written = 0
                with open(partial, "wb") as f:
                    for chunk in r.iter_raw(1 << 20):
                        written += len(chunk)
                        if written > MAX_TRACE_BYTES:
                            raise CaptureError(f"{name} is over the {MAX_TRACE_BYTES >> 30} GiB cap per rank file")
                        if deadline is not None and self._clock() > deadline:
                            raise CaptureError(f"download of {name} did not finish before the capture's timeout")
                        f.write(chunk)
                        if written % (64 << 20) < len(chunk):      # every ~64 MB: is the disk filling up?
                            _check_free(target.parent, 0)
        except httpx.HTTPError as e:
            partial.unlink(missing_ok=True)
            raise CaptureError(f"download of {name} failed ({type(e).__name__}: {e})") from None
        except (CaptureError, OSError):
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)
        return target

    # -- helpers --------------------------------------------------------------------------------
    def _get_json(self, path: str, hint: str = "") -> Any:
        try:
            with self._client.stream("GET", path) as r:
                status, body = r.status_code, _capped(r, MAX_LISTING_BYTES + 1)
        except httpx.HTTPError as e:
            raise CaptureError(f"{self.base_url}{path}: {type(e).__name__}: {e}") from None
        if status != 200:
            raise CaptureError(f"{path} answered {status}{hint}: {_one_line(body.decode(errors='replace'))}")
        if len(body) > MAX_LISTING_BYTES:
            raise CaptureError(f"{path} answered more than {MAX_LISTING_BYTES >> 20} MB{hint}")
        try:
            return json.loads(body)
        except (ValueError, RecursionError):     # not JSON, or nested past the recursion limit
            raise CaptureError(f"{path} did not answer JSON{hint}") from None

    def _progress(self, stage: str, pid: str, ready: int, expected: int, message: str) -> None:
        if self._on_progress is not None:
            self._on_progress(CaptureProgress(stage, pid, ready, expected, message))


def _listed_files(listing: Any, pid: str) -> dict[str, int]:
    """name -> size for this capture's files in a /specdecode/traces reply; anything else is ignored."""
    files = listing.get("files") if isinstance(listing, dict) else None
    out: dict[str, int] = {}
    for f in files if isinstance(files, list) else []:
        name = f.get("name") if isinstance(f, dict) else None
        size = f.get("size") if isinstance(f, dict) else None
        if isinstance(name, str) and isinstance(size, int) and _is_capture_file(name, pid):
            out[name] = size
    return out


def _is_capture_file(name: str, pid: str) -> bool:
    """`{pid}-TP-{rank}.trace.json.gz`, or with SGLang's `{prefix}-` in front."""
    m = TRACE_NAME.match(name)
    return m is not None and (m.group("profile_id") == pid or m.group("profile_id").endswith("-" + pid))


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def gzip_complete(path: Path) -> bool:
    """True when the file is one whole gzip stream (its end marker read), i.e. fully written."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        with open(path, "rb") as f:
            while not d.eof:
                chunk = f.read(1 << 20)
                if not chunk:
                    return False
                while chunk and not d.eof:
                    d.decompress(chunk, 1 << 22)  # bounded output; the data itself is not kept
                    chunk = d.unconsumed_tail
    except (OSError, zlib.error):
        return False
    return True


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _rank_of(p: Path) -> int:
    m = TRACE_NAME.match(p.name)
    return int(m.group("rank")) if m else 0


def _capped(resp: httpx.Response, cap: int) -> bytes:
    """At most `cap` bytes of a streamed body (the rest is never read)."""
    got = bytearray()
    for chunk in resp.iter_bytes():
        got.extend(chunk)
        if len(got) >= cap:
            break
    return bytes(got[:cap])


def _check_free(directory: Path, need: int) -> None:
    """CaptureError when writing `need` more bytes would leave less than MIN_FREE_BYTES free."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free - need < MIN_FREE_BYTES:
        raise CaptureError(f"not enough free disk space in {directory} for the trace download "
                           f"({free >> 20} MB free, {need >> 20} MB needed, {MIN_FREE_BYTES >> 20} MB kept free)")
