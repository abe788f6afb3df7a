"""A URL's userinfo password never reaches a recording, a report or the terminal (the red team's
N14), and escape codes from server strings never reach the HTML report (N15)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.core.records import Event, Sample
from tuner.core.redact import redact, redact_text, redact_url
from tuner.recording import Recorder
from tuner.report.svg import esc

ROOT = Path(__file__).resolve().parents[2]
PASS = "URLPASS99"
ESC = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mEVIL\x1b[0m"


@pytest.mark.parametrize("text, want", [
    ("http://admin:URLPASS99@127.0.0.1:30000", "http://admin:***@127.0.0.1:30000"),
    ("GET https://u:p%40ss@host/metrics: refused", "GET https://u:***@host/metrics: refused"),
    ("record http://a:b@h:1 --out x.db", "record http://a:***@h:1 --out x.db"),
    ("http://user@host:1/x", "http://user@host:1/x"),
    ("http://127.0.0.1:30000/v1/models", "http://127.0.0.1:30000/v1/models"),
    ("no url: a:b@c", "no url: a:b@c"),
])
def test_url_passwords_are_redacted(text, want):
    assert redact_url(text) == want
    assert redact_text(text) == want
    assert redact({"launch_command": text})["launch_command"] == want


def test_html_escapes_strip_control_characters():
    assert esc(ESC + "<b>") == "EVIL&lt;b&gt;"
    assert "\x1b" not in esc(ESC) and "\x07" not in esc(ESC)


def test_recording_and_report_hold_no_password_and_no_escape(tmp_path):
    db, html = tmp_path / "u.db", tmp_path / "u.html"
    url = f"http://admin:{PASS}@127.0.0.1:1"
    launch = {"served_model_name": "tiny" + ESC, "tp_size": 2}
    info = {"kind": "refengine", "version": "0.1" + ESC, "model": "tiny" + ESC, "tp_size": 2, "launch": launch,
            "active": {}}
    rec = Recorder(db, {"backend": "refengine", "url": url, "server_info": info, "launch": launch,
                        "command": f"specdecode-tune record {url} --out u.db"})
    rec.write([Event(1.0, "connected", {"url": url, "backend": "refengine", "after_s": 0}),
               Event(2.0, "disconnected", {"url": url, "since": 2.0, "error": f"GET {url}/metrics: " + ESC}),
               Sample(1.5, "server/tok_per_s", 10.0), Sample(2.5, "server/tok_per_s", 11.0)])
    rec.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("u.db"))
    assert PASS.encode() not in raw
    assert main(["report", str(db), "--out", str(html)]) == 0
    text = html.read_text()
    assert PASS not in text and "\x1b" not in text and "\x07" not in text
    assert "EVIL" in text          # the text stays, only the codes go


def test_record_and_once_never_show_the_password(tp2_server, tmp_path):
    host = tp2_server.url.removeprefix("http://")
    url = f"http://admin:{PASS}@{host}"
    out = tmp_path / "u.db"
    run = [sys.executable, "-m", "tuner"]
    rec = subprocess.run([*run, "record", url, "--out", str(out), "--duration", "2s"], cwd=ROOT,
                         capture_output=True, text=True, timeout=180)
    assert rec.returncode == 0, rec.stderr[-500:]
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("u.db"))
    assert PASS.encode() not in raw and PASS not in rec.stdout + rec.stderr
    once = subprocess.run([*run, "once", url, "--seconds", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert once.returncode in (0, 1), once.stderr[-500:]
    assert PASS not in once.stdout + once.stderr and "admin:***@" in once.stdout
