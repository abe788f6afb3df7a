"""Profiler request parsing and the trace files this server wrote, listed and served by name.

A download takes a file *name* that must match SGLang's trace naming and be found in a directory
this server itself wrote traces to; it never accepts a path. Must not start or stop profilers.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# `{profile_id}-TP-{rank}.trace.json.gz` (SGLang's name; an optional `{prefix}-` in front).
TRACE_NAME = re.compile(r"^(?P<profile_id>[A-Za-z0-9][A-Za-z0-9._-]*)-TP-(?P<rank>\d+)\.trace\.json\.gz$")
PROFILE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ACTIVITIES = ("CPU", "GPU", "CUDA")


class ProfileRequestError(ValueError):
    pass


@dataclass(frozen=True)
class ProfileRequest:
    output_dir: str
    num_steps: int | None
    activities: tuple[str, ...]
    with_stack: bool
    record_shapes: bool
    profile_id: str
    profile_prefix: str = ""

    @property
    def file_stem(self) -> str:
        """What the rank files start with: SGLang writes `{prefix}-{profile_id}-TP-{rank}...`
        (scheduler_components/profiler_manager.py:333-358), so the prefix joins the id here."""
        return f"{self.profile_prefix}-{self.profile_id}" if self.profile_prefix else self.profile_id


_SERVER_DIRS: dict[str, str] = {}


def default_output_dir() -> str:
    # SGLang: the scheduler reads SGLANG_TORCH_PROFILER_DIR, else a temp directory. Not the shared
    # temp directory itself: there any local user could plant trace files this server would list and
    # serve, so a private one of this user's inside it; and one per server process, or two servers of
    # one user would list and serve each other's traces.
    return os.environ.get("SGLANG_TORCH_PROFILER_DIR") or server_trace_dir()


def server_trace_dir() -> str:
    """This server's own directory inside the user's private one (made once per process)."""
    parent = private_trace_dir()
    d = _SERVER_DIRS.get(parent)
    if d is None or not os.path.isdir(d):
        d = _SERVER_DIRS[parent] = tempfile.mkdtemp(prefix=f"server-{os.getpid()}-", dir=parent)
    return d


def private_trace_dir() -> str:
    """`$TMPDIR/specdecode-traces-<uid>`, mode 700, owned by this user; when that name is taken by
    something else (another owner, a link, open permissions) a fresh private directory instead."""
    d = os.path.join(tempfile.gettempdir(), f"specdecode-traces-{os.getuid()}")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix="specdecode-traces-")
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return tempfile.mkdtemp(prefix="specdecode-traces-")       # 0700 by construction
    return d


def confine_output_dir(output_dir: str, root: str) -> str:
    """`output_dir` resolved, when it lies inside `root` (the trace root); ProfileRequestError otherwise.

    Used off loopback or behind a flag (the HTTP layer decides): on loopback without a key SGLang's
    accepted inputs win and any directory the server can write is taken, as SGLang does.
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, output_dir))
    if os.path.commonpath([real, real_root]) != real_root:
        raise ProfileRequestError(f"output_dir must lie inside the trace root {root} on this server")
    return real


# Without num_steps a profile runs until /stop_profile; where that is capped (off loopback), it stops
# by itself after this many decode steps.
MAX_UNBOUNDED_PROFILE_STEPS = 200


def parse_profile_request_strict(body: dict[str, Any], device: str, root: str | None = None) -> ProfileRequest:
    """parse_profile_request with the limits for shared or exposed servers (restrict_profile_request)."""
    return restrict_profile_request(parse_profile_request(body, device), root)


def restrict_profile_request(req: ProfileRequest, root: str | None = None) -> ProfileRequest:
    """The limits for shared or exposed servers: output_dir confined to the trace root, and a profile
    without num_steps stopped after MAX_UNBOUNDED_PROFILE_STEPS. ProfileRequestError when refused."""
    root = root or default_output_dir()
    out = confine_output_dir(req.output_dir, root)
    steps = req.num_steps if req.num_steps is not None else MAX_UNBOUNDED_PROFILE_STEPS
    return ProfileRequest(output_dir=out, num_steps=min(steps, MAX_UNBOUNDED_PROFILE_STEPS),
                          activities=req.activities, with_stack=req.with_stack,
                          record_shapes=req.record_shapes, profile_id=req.profile_id)


def parse_profile_request(body: dict[str, Any], device: str) -> ProfileRequest:
    """Validate a /start_profile body (all fields optional, as SGLang's ProfileReq)."""
    def field(name: str, types: tuple[type, ...], default: Any) -> Any:
        v = body.get(name)
        if v is None:
            return default
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ProfileRequestError(f"{name}: expected {'/'.join(t.__name__ for t in types)}, got {v!r}")
        return v

    # ProfileReq's fields (io_struct.py:2374-2400) this engine cannot honour: refused by name,
    # never ignored (the rows of tests/conformance/test_profile_options.py).
    unsupported = [k for k in ("profile_by_stage", "merge_profiles", "profile_stages", "detailed_annotations")
                   if body.get(k)]
    if unsupported:
        raise ProfileRequestError(f"{', '.join(unsupported)} is not supported by the reference engine")
    if body.get("start_step") is not None:
        raise ProfileRequestError("start_step is not supported by the reference engine; start now instead")
    output_dir = field("output_dir", (str,), None) or default_output_dir()
    num_steps = field("num_steps", (int,), None)
    if num_steps is not None and num_steps < 1:
        raise ProfileRequestError(f"num_steps must be >= 1, got {num_steps}")
    acts = field("activities", (list,), ["CPU", "GPU"])
    bad = [a for a in acts if a not in ACTIVITIES]
    if bad:
        raise ProfileRequestError(f"activities: {bad} not supported (use CPU and GPU)")
    # GPU activity on a CPU engine is SGLang's default request; it simply records nothing.
    activities = tuple(dict.fromkeys("GPU" if a == "CUDA" else a for a in acts
                                     if device == "cuda" or a == "CPU"))
    profile_id = field("profile_id", (str, int, float), None)
    profile_id = str(time.time()) if profile_id is None else str(profile_id)
    if not PROFILE_ID.match(profile_id):
        raise ProfileRequestError(f"profile_id {profile_id!r} may hold only letters, digits, '.', '_' and '-'")
    prefix = field("profile_prefix", (str,), "")
    if prefix and not PROFILE_ID.match(f"{prefix}-{profile_id}"):
        raise ProfileRequestError(f"profile_prefix {prefix!r} may hold only letters, digits, '.', '_' and '-'")
    return ProfileRequest(
        output_dir=output_dir, num_steps=num_steps, activities=activities or ("CPU",),
        with_stack=bool(field("with_stack", (bool,), True)),
        record_shapes=bool(field("record_shapes", (bool,), True)), profile_id=profile_id,
        profile_prefix=prefix,
    )


class TraceFiles:
    """The directories this server wrote traces to, and the trace files found in them."""

    def __init__(self) -> None:
        self._dirs: list[Path] = []
        self._lock = threading.Lock()

    def add_dir(self, path: str) -> None:
        p = Path(path).resolve()
        with self._lock:
            if p not in self._dirs:
                self._dirs.append(p)

    def listing(self) -> list[dict[str, Any]]:
        files: dict[str, dict[str, Any]] = {}
        with self._lock:
            dirs = list(self._dirs)
        for d in dirs:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                m = TRACE_NAME.match(e.name)
                if m and e.is_file(follow_symlinks=False) and e.name not in files:
                    files[e.name] = {"name": e.name, "size": e.stat().st_size,
                                     "rank": int(m.group("rank")), "profile_id": m.group("profile_id"),
                                     "mtime": e.stat().st_mtime}
        return sorted(files.values(), key=lambda f: (f["mtime"], f["name"]))

    def locate(self, name: str) -> Path | None:
        """The file for a listed name, or None; names that are not trace names never touch the disk."""
        if not TRACE_NAME.match(name):
            return None
        with self._lock:
            dirs = list(self._dirs)
        for d in dirs:
            p = d / name
            if p.is_file() and not p.is_symlink():
                return p
        return None
