"""Keys never leave the process (D6, D19) and server strings are data (D9): the key file rules, the
environment variable, redaction by value and by flag (argv, launch_command), serve's options, and
terminal-safe text in the TUI header."""

from __future__ import annotations

import os

import pytest

from probes.api_key import ENV_VAR, ApiKeyError, read_key_file, resolve_api_key
from tuner.backends.common_info import common_info, redact
from tuner.commands.keys import argv_for_record
from tuner.core.text import terminal_safe

ESC = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mEVIL\x1b[0m\x9b2J"


def test_key_file_first_line_and_permissions(tmp_path):
    f = tmp_path / "key"
    f.write_text("s3cret\nsecond line\n")
    f.chmod(0o600)
    assert read_key_file(str(f)) == "s3cret"
    f.chmod(0o640)
    with pytest.raises(ApiKeyError) as e:
        read_key_file(str(f))
    assert "group or others" in str(e.value) and "s3cret" not in str(e.value) and "\n" not in str(e.value)
    f.chmod(0o600)
    f.write_text("\n")
    with pytest.raises(ApiKeyError, match="first line is empty"):
        read_key_file(str(f))
    with pytest.raises(ApiKeyError, match="cannot read"):
        read_key_file(str(tmp_path / "missing"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ApiKeyError, match="not a regular file"):      # and it does not block
        read_key_file(str(fifo))


def test_key_sources_in_order(tmp_path):
    f = tmp_path / "key"
    f.write_text("fromfile")
    f.chmod(0o600)
    assert resolve_api_key("flag", None, {ENV_VAR: "env"}) == "flag"
    assert resolve_api_key(None, str(f), {ENV_VAR: "env"}) == "fromfile"
    assert resolve_api_key(None, None, {ENV_VAR: "env"}) == "env"
    assert resolve_api_key(None, None, {}) is None
    with pytest.raises(ApiKeyError, match="not both"):
        resolve_api_key("flag", str(f), {})


def test_argv_redacted_by_value_and_flag():
    argv = ["URL", "--out", "r.db", "--api-ke", "K1", "--api=K1", "--api-key-file", "/k", "--api-key", "K2"]
    out = argv_for_record(argv, "K1")
    assert "K1" not in " ".join(out) and "K2" not in " ".join(out)
    assert out[:3] == ["URL", "--out", "r.db"] and "/k" in out


def test_launch_command_secrets_are_redacted():
    raw = {"launch_command": "python -m sglang.launch_server --model-path m --api-key SECRET1 "
                             "--admin-api-key=SECRET2 --hf-token 'SECRET3' --port 1",
           "argv": ["serve", "--api-key", "SECRET4"], "api_key": "SECRET5", "max_total_tokens": 5,
           "tokenizer_path": "tok", "internal_states": [{"nested": {"cmd": "--api-ke SECRET6"}}]}
    red = redact(raw)
    assert "SECRET" not in repr(red)
    assert red["max_total_tokens"] == 5 and red["tokenizer_path"] == "tok"
    assert "--model-path m" in red["launch_command"] and "--port 1" in red["launch_command"]


def test_serve_refuses_an_abbreviated_key_flag_without_echoing_it(capsys):
    from refengine.server.options import parse_options

    with pytest.raises(SystemExit):
        parse_options(["--api-ke=abbrkey"])
    err = capsys.readouterr().err
    assert "ambiguous option" in err and "abbrkey" not in err


def test_serve_reads_the_key_file_and_env_and_never_shows_the_key(tmp_path, monkeypatch):
    from refengine.server.options import OptionsError, parse_options

    f = tmp_path / "key"
    f.write_text("filekey\n")
    f.chmod(0o600)
    monkeypatch.delenv(ENV_VAR, raising=False)
    o = parse_options(["--api-key-file", str(f), "--host", "0.0.0.0"])
    assert o.api_key == "filekey" and "filekey" not in repr(o.resolved_dict())
    monkeypatch.setenv(ENV_VAR, "envkey")
    assert parse_options([]).api_key == "envkey"
    monkeypatch.delenv(ENV_VAR)
    o = parse_options(["--api-key=flagkey", "--port", "1"])
    assert o.api_key == "flagkey" and "flagkey" not in o.resolved_dict()["launch_command"]
    f.chmod(0o644)
    with pytest.raises(OptionsError, match="group or others"):
        parse_options(["--api-key-file", str(f)])
    with pytest.raises(OptionsError, match="without --api-key"):
        parse_options(["--host", "0.0.0.0"])


def test_terminal_safe_strips_sequences_and_controls():
    assert terminal_safe(ESC) == "EVIL"
    assert terminal_safe("a\nb\tc") == "a b c" and terminal_safe("a\nb", keep_newlines=True) == "a\nb"
    assert terminal_safe("tok/s ✓ é") == "tok/s ✓ é"
    info = common_info("sglang", {"version": "0.5" + ESC, "served_model_name": ESC, "tp_size": "two",
                                  "internal_states": [{"speculative_draft_placement": ESC,
                                                       "speculative_num_steps": [1]}]})
    assert info["version"] == "0.5EVIL" and info["model"] == "EVIL" and info["tp_size"] is None
    assert info["active"] == {"speculative_draft_placement": "EVIL"}


def test_tui_header_shows_no_control_characters():
    from tuner.widgets.header import HeaderView, ServerHeader

    content = ServerHeader.markup(HeaderView(kind="sglang", version=ESC, model=ESC, host=ESC, setting=ESC,
                                             connection="degraded", detail="GET /metrics" + ESC))
    text = content.plain
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "◐ degraded" in text and "EVIL" in text


def test_default_trace_dir_is_private(tmp_path, monkeypatch):
    import stat

    from refengine.server.profiles import default_output_dir

    monkeypatch.delenv("SGLANG_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)          # re-read TMPDIR
    d = default_output_dir()
    st = os.stat(d)
    assert d != str(tmp_path) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0
    assert default_output_dir() == d, "one directory per server process"
    # a planted directory of the user's name that others may write is not used
    user_dir = os.path.dirname(d)
    assert stat.S_IMODE(os.stat(user_dir).st_mode) & 0o077 == 0
    os.chmod(user_dir, 0o777)
    other = default_output_dir()
    assert not other.startswith(user_dir + os.sep) and stat.S_IMODE(os.stat(other).st_mode) & 0o077 == 0


def test_two_servers_of_one_user_get_their_own_trace_directories(tmp_path):
    """The red team saw one server list another's traces: the default directory was per user."""
    import subprocess
    import sys

    code = "from refengine.server.profiles import default_output_dir; print(default_output_dir())"
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_TORCH_PROFILER_DIR"}
    env["TMPDIR"] = str(tmp_path)
    dirs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
            .stdout.strip() for _ in range(2)]
    assert dirs[0] != dirs[1] and all(d.startswith(str(tmp_path)) for d in dirs), dirs
    assert os.path.dirname(dirs[0]) == os.path.dirname(dirs[1])      # both in the user's private one


def test_strict_profile_request_is_confined_and_capped(tmp_path):
    from refengine.server.profiles import (
        MAX_UNBOUNDED_PROFILE_STEPS, ProfileRequestError, parse_profile_request, parse_profile_request_strict,
    )

    root = tmp_path / "traces"
    root.mkdir()
    # SGLang's inputs on loopback: any directory, unbounded
    loose = parse_profile_request({"output_dir": "/somewhere/else"}, "cpu")
    assert loose.output_dir == "/somewhere/else" and loose.num_steps is None
    strict = parse_profile_request_strict({"output_dir": "run1"}, "cpu", str(root))
    assert strict.output_dir == str(root / "run1") and strict.num_steps == MAX_UNBOUNDED_PROFILE_STEPS
    for bad in ("/etc", "../x", str(tmp_path)):
        with pytest.raises(ProfileRequestError, match="inside the trace root"):
            parse_profile_request_strict({"output_dir": bad}, "cpu", str(root))


# ----- keys with whitespace, control or non-ASCII characters (the red team's N7, N19) -------------

def test_key_is_stripped_and_unsendable_keys_are_refused_without_echo(tmp_path):
    assert resolve_api_key(None, None, {ENV_VAR: "SEKRIT-KEY-4242\n"}) == "SEKRIT-KEY-4242"
    assert resolve_api_key(" k \t", None) == "k"
    assert resolve_api_key(None, None, {ENV_VAR: " \n"}) is None
    for key, words in [("SEK\x01RIT", "control character"), ("SEK\nRIT", "control character"),
                       ("ключ-SEKRIT", "non-ASCII"), ("SEKRIT\x7f", "control character")]:
        with pytest.raises(ApiKeyError) as e:
            resolve_api_key(None, None, {ENV_VAR: key})
        msg = str(e.value)
        assert words in msg and ENV_VAR in msg and "SEK" not in msg and "ключ" not in msg and "\n" not in msg


def test_once_with_a_newline_key_works_and_a_bad_key_is_one_line(tp2_server):
    """`once` as a real child: a key with a trailing newline (as `$(cat key)` can give) is stripped,
    and neither a control character nor a non-ASCII one puts the key on the terminal."""
    from tests.hostile.conftest import run_cli

    ok = run_cli("once", tp2_server.url, "--seconds", "1", env={ENV_VAR: "SEKRIT-KEY-4242\n"})
    assert ok.rc == 0, ok.err[-400:]
    assert "SEKRIT" not in ok.out + ok.err
    for key, words in [("SEKRIT-\x01KEY", "control character"), ("ключ-SEKRIT", "non-ASCII")]:
        bad = run_cli("once", tp2_server.url, "--seconds", "1", env={ENV_VAR: key})
        text = bad.out + bad.err
        assert bad.rc != 0 and words in text, text[-400:]
        assert "SEKRIT" not in text and "ключ" not in text and "Traceback" not in text
        assert "invalid URL" not in text
        assert len(bad.err.strip().splitlines()) == 1, bad.err


def test_http_client_refuses_a_key_it_cannot_send_without_echo():
    from tuner.backends.http import HttpClient, ServerError

    with pytest.raises(ServerError) as e:
        HttpClient("http://127.0.0.1:9", api_key="SEKRIT\nX")
    assert "SEKRIT" not in str(e.value) and "control character" in str(e.value)
