"""Text from policy code is made safe to print (ratchet.text)."""

from __future__ import annotations

from ratchet.text import clean


def test_escape_sequences_and_controls_become_visible():
    assert clean("a\x1b[2K\x1b[1A\rb\x07\x00\x7f\x9b") == "a\\x1b[2K\\x1b[1A\\rb\\x07\\x00\\x7f\\x9b"
    assert clean("one\ntwo\tthree") == "one\\ntwo\\tthree"
    assert clean("one\ntwo\tthree", multiline=True) == "one\ntwo\tthree"
    assert clean("\x1b[31m", multiline=True) == "\\x1b[31m"


def test_lone_surrogates_and_bidi_overrides_become_visible():
    out = clean("\ud800x\udfff\u202eevil\u2066")
    assert out == "\\ud800x\\udfff\\u202eevil\\u2066"
    out.encode("utf-8")  # a lone surrogate cannot be encoded: printing it crashes


def test_ordinary_text_is_unchanged():
    text = "policy raised ZeroDivisionError: division by zero — ±0.418 rad, naïve, 日本"
    assert clean(text) == text


def test_length_is_bounded_after_escaping():
    assert clean("x" * 600, 20) == "x" * 19 + "…"
    assert len(clean("\x1b" * 10_000, 100)) == 100
    assert clean("short", 20) == "short"
    assert len(clean("y" * 10**6, None)) == 10**6


def test_non_text_is_shown_through_str():
    assert clean(12345) == "12345"
    assert clean(None) == "None"
