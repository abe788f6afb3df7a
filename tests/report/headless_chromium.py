"""Drive Debian's chromium headless over the DevTools protocol on a pipe (--remote-debugging-pipe:
NUL-separated JSON on fds 3/4, so no websocket library is needed): open a page, collect console
messages, uncaught exceptions, failed loads and log errors, measure elements, take a screenshot."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--remote-debugging-pipe"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return None


@dataclass
class PageResult:
    problems: list[str] = field(default_factory=list)       # console errors/warnings, exceptions, failed loads
    messages: list[str] = field(default_factory=list)       # every console message, for diagnosis
    boxes: list[dict[str, Any]] = field(default_factory=list)
    png: bytes = b""
    requests: list[str] = field(default_factory=list)       # every URL the page asked for
    value: Any = None                                       # what `evaluate` returned (JSON-shaped)


class Chromium:
    def __init__(self, exe: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:   # runs in the child: the protocol pipe must be fds 3 (in) and 4 (out)
            r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)   # out of the way of 3 and 4 first
            w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=wire, pass_fds=(3, 4))
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        want = self._id
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            m = self._read()
            if m.get("id") == want:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)
        raise TimeoutError(method)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for m in self.events:
            if m.get("method") == method and m.get("sessionId") == session:
                return m
        while time.monotonic() < deadline:
            m = self._read()
            self.events.append(m)
            if m.get("method") == method and m.get("sessionId") == session:
                return m
        raise TimeoutError(method)

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:   # noqa: BLE001 - it may already be gone; the kill below makes sure
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


def open_page(exe: str, path: Path, width: int = 1000, selector: str = "svg", evaluate: str | None = None
              ) -> PageResult:
    """Load a local file, wait for it, and report what the page did and how it looks; `evaluate`:
    a JavaScript expression whose JSON-shaped value comes back as `value`."""
    b = Chromium(exe)
    out = PageResult()
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            b.send(f"{domain}.enable", session=sid)
        b.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                      "mobile": False}, session=sid)
        b.send("Page.navigate", {"url": path.resolve().as_uri()}, session=sid)
        b.wait_event("Page.loadEventFired", sid)
        boxes = b.send("Runtime.evaluate", {"expression": (
            "JSON.stringify([...document.querySelectorAll(%s)].map(e => {const r = e.getBoundingClientRect();"
            " return {x: r.x + scrollX, y: r.y + scrollY, w: r.width, h: r.height, cls: e.getAttribute('class') || '',"
            " label: e.getAttribute('aria-label') || ''}}))" % json.dumps(selector)), "returnByValue": True}, session=sid)
        out.boxes = json.loads(boxes["result"]["value"])
        if evaluate is not None:
            out.value = json.loads(b.send("Runtime.evaluate", {"expression": f"JSON.stringify({evaluate})",
                                                               "returnByValue": True}, session=sid)["result"]["value"])
        height = b.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                             "returnByValue": True}, session=sid)["result"]["value"]
        b.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": int(height), "deviceScaleFactor": 1,
                                                      "mobile": False}, session=sid)
        shot = b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)
        out.png = base64.b64decode(shot["data"])
        # Anything still in flight (late console messages) arrives before the reply to this no-op.
        b.send("Runtime.evaluate", {"expression": "1"}, session=sid)
    finally:
        b.close()
    for m in b.events:
        method, p = m.get("method"), m.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            out.messages.append(f"console.{p.get('type')}: {text}")
            if p.get("type") in ("error", "warning", "assert"):
                out.problems.append(f"console.{p.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.problems.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded":
            e = p.get("entry", {})
            out.messages.append(f"log.{e.get('level')}: {e.get('text')}")
            if e.get("level") in ("error", "warning"):
                out.problems.append(f"log.{e.get('level')}: {e.get('text')} {e.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            out.requests.append(p.get("request", {}).get("url", ""))
        elif method == "Network.loadingFailed":
            out.problems.append(f"load failed: {p.get('errorText')}")
    return out
