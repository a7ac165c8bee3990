"""Cleaning text that came from policy code before it reaches a terminal, a ledger or a report.

Policy code chooses its exception messages, and a worker's log holds whatever it wrote. Such text
may carry terminal escape sequences (``"\\x1b[2K\\x1b[1A"`` erases and rewrites the lines above it),
carriage returns, bidirectional-override characters (reorder what a reader sees), or lone UTF-16
surrogates (``"\\ud800"``, which cannot be encoded to UTF-8 and crash any ``print``). :func:`clean`
turns every such character into a visible escape, so the text stays readable and harmless.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["clean"]

# C0 controls (bar tab and newline, handled below), DEL, C1 controls, lone surrogates, the Unicode
# line/paragraph separators, and the bidirectional embedding/override/isolate characters.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_ONE_LINE = re.compile("[\t\n]|" + _UNSAFE.pattern)
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: Any, max_len: int | None = 500, *, multiline: bool = False) -> str:
    """``text`` made safe to print: control characters and lone surrogates become visible escapes.

    Args:
        text: Any value; a non-string (e.g. an ``error`` of ``12345`` in an old ledger) is shown
            through ``str()``.
        max_len: Longest result, in characters (escapes included); longer text is cut and ends in
            ``"…"``. None: no bound.
        multiline: Keep newlines and tabs (for a block of text such as a critique); otherwise they
            are escaped too, so the result is one line.

    Returns:
        A string with no C0/C1 control character (ESC always escaped: ``"\\x1b"`` → ``"\\\\x1b"``),
        no lone surrogate (``"\\ud800"`` → ``"\\\\ud800"``) and no bidirectional override, encodable
        as UTF-8.
    """
    if not isinstance(text, str):
        try:
            text = str(text)
        except Exception:  # noqa: BLE001 - any object's __str__ may raise anything
            text = "<unprintable>"
    if max_len is not None and len(text) > 4 * max_len + 4:
        text = text[:4 * max_len + 4]  # an escape is at most 6 characters; bound the work first
    out = (_UNSAFE if multiline else _UNSAFE_ONE_LINE).sub(_escape, text)
    if max_len is not None and len(out) > max_len:
        out = out[:max(0, max_len - 1)] + "…"
    return out
