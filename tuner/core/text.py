"""Server strings are data: make any text safe to put on a terminal or in a TUI widget.

A server's model name, version, error message or config value may hold escape sequences (clear the
screen, set the window title, OSC 52 clipboard writes). `terminal_safe` removes whole ANSI escape
sequences and every other C0/C1 control character (keeping newline and tab only where asked), so what
reaches the terminal is the text and nothing the terminal would act on. Must not do any other
formatting: callers decide what to show.
"""

from __future__ import annotations

import re
from typing import Any

# ESC-introduced sequences (CSI ... final, OSC ... BEL/ST, DCS/SOS/PM/APC ... ST, two-byte ESC x) and
# their 8-bit C1 forms, then any control character that is left.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"                      # CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)"   # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?",                                    # other ESC sequences (and a lone ESC)
    re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_NO_NL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def terminal_safe(text: Any, keep_newlines: bool = False) -> str:
    """`text` (anything; str() of it) without escape sequences or control characters.

    Tabs and (with keep_newlines) newlines stay; without keep_newlines they become spaces, so one
    line stays one line.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    s = _SEQUENCE.sub("", s)
    if keep_newlines:
        return _CONTROL.sub("", s)
    return _CONTROL_NO_NL.sub(lambda m: " " if m.group() in "\t\n\r" else "", s)
