"""Marked regions of source files in any language: their numbers as parameters, and values written back.

The program-evolution field (AlphaEvolve, OpenEvolve, ShinkaEvolve) marks the part of a program that may change
with two comments, in whatever comment syntax the language has::

    // EVOLVE-BLOCK-START
    const double tight_gap = 0.02;   // ratchet: tight_gap 0..0.1
    const int rounds = 8;            // ratchet: 1..32
    // EVOLVE-BLOCK-END

This module finds such regions (:func:`find_regions`), reads the numeric literals in them as parameters
(:func:`extract`) and writes values back (:func:`substitute`): only the characters of the substituted literals
change, every other byte of the file stays as it was. It is pure (text in, text out: no files, no processes) and
knows no language by name, so a C++ program, a Rust crate and an OpenEvolve Python program are read alike.

**Comment syntax** is read from the marker line itself: the comment token written before ``EVOLVE-BLOCK-START``
(``//``, ``/*``, ``#``, ``--`` or ``;``) is the file's line comment (``/*`` and ``//`` also mean C-style ``/* */``
block comments). Inside a region, numbers in comments and in string literals (``"..."``; ``'...'`` too, except in a
C-style file, where only a short character literal such as ``'x'`` is one; in a ``#`` file, triple-quoted strings
spanning lines, such as Python docstrings) are not parameters.

**Literals.** An unsigned decimal number: ``42``, ``0.5``, ``.5``, ``3.``, ``1e-3``, ``2.5E+4``, with ``_`` between
digits (Rust, Python) and a type suffix kept as written (C's ``f``/``F``/``L``/``u``/``U``, Rust's ``f64``, ``i32``,
``usize``, ...). A sign belongs to the expression, not to the literal, so a value below zero is written back in
parentheses: ``(-0.25)``. Hexadecimal, octal and binary literals are left alone, and so is any digit that is part of
a name (``x2``, ``int64_t``).

**Parameters and bounds.** Each literal is a parameter: an *int* parameter for an integer literal, a *float* one
otherwise. Without an annotation its name is made from the file and line (``main_cpp_L12``, ``_2`` for the second on
the line) and its bounds are a range around the literal ``v``: ``[0, 2v]`` (``[0, 1]`` for ``v = 0``; an int's at
least ``[0, 2]``), so a value keeps its sign and can double or vanish. An **annotation** in a comment on the literal's
line overrides that: ``ratchet:`` followed by one item per literal on the line, in order, separated by ``;``. An item
is made of words in any order:

- a name (an identifier): the parameter's name (unique in the program);
- ``LOW..HIGH`` (e.g. ``-1..1``, ``1e-4..0.1``): its bounds (the literal must lie in them);
- ``log``: searched in log space (needs ``LOW > 0``);
- ``fixed`` (or ``-``): this literal is not a parameter.

An item may be empty (``ratchet: ; gain 0..3`` annotates only the second literal). Mistakes (an unknown word,
bounds that exclude the literal, a name used twice, an unterminated region) raise :class:`RegionError` with the file
and line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ratchet.errors import PolicyError

__all__ = ["END", "START", "Literal", "Region", "RegionError", "extract", "find_regions", "format_value",
           "substitute"]

START = "EVOLVE-BLOCK-START"
END = "EVOLVE-BLOCK-END"

#: Comment tokens a marker line may use, longest first (``/*`` before ``//``? both are C-style).
_TOKENS = ("//", "/*", "--", "#", ";")

_SUFFIX = r"(?:_?(?:f32|f64|i8|i16|i32|i64|i128|isize|u8|u16|u32|u64|u128|usize)|[fFlLuU]{1,3})?"
_NUMBER = re.compile(
    r"(?<![\w.])"
    r"(?P<core>(?:\d[\d_]*)?\.\d[\d_]*(?:[eE][+-]?\d+)?|\d[\d_]*\.(?:\d[\d_]*)?(?:[eE][+-]?\d+)?"
    r"|\d[\d_]*[eE][+-]?\d+|\d[\d_]*)"
    r"(?P<suffix>" + _SUFFIX + r")"
    r"(?![\w.])")
_ANNOTATION = re.compile(r"ratchet:(.*)")
_RANGE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\.\.([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)$")


class RegionError(PolicyError):
    """A marked region or an annotation that cannot be read (the message names the file and line)."""


@dataclass(frozen=True)
class Region:
    """One marked region: the lines strictly between its markers.

    Attributes:
        start: Offset (characters) of the first character after the start marker's line.
        end: Offset of the first character of the end marker's line.
        line: 1-based line number of the start marker.
        comment: The file's line-comment token, as read from the marker line.
    """

    start: int
    end: int
    line: int
    comment: str


@dataclass(frozen=True)
class Literal:
    """A numeric literal in a region that is a parameter.

    Attributes:
        name: The parameter's name.
        start: Offset (characters) of the literal's first character in the file's text.
        end: Offset just past its last digit (a type suffix, kept, is after it).
        line: 1-based line number.
        text: The literal as written (without its suffix).
        value: Its value (float; an int literal's value is integral).
        is_int: Whether it is an integer literal (written back as an integer).
        low: Lower bound, inclusive.
        high: Upper bound, inclusive (``low < high``).
        scale: ``"linear"`` or ``"log"``.
    """

    name: str
    start: int
    end: int
    line: int
    text: str
    value: float
    is_int: bool
    low: float
    high: float
    scale: str = "linear"


def _marker_comment(line: str, marker: str) -> str | None:
    """The comment token written before ``marker`` on ``line`` (the nearest one), or None (not a marker line)."""
    at = line.find(marker)
    if at < 0:
        return None
    head = line[:at]
    best: tuple[int, str] | None = None
    for tok in _TOKENS:
        k = head.rfind(tok)
        if k >= 0 and (best is None or k > best[0] or (k == best[0] and len(tok) > len(best[1]))):
            best = (k, tok)
    if best is None:
        return None
    return "//" if best[1] == "/*" else best[1]


def find_regions(text: str, path: str = "<text>") -> list[Region]:
    """The marked regions of ``text``, in order.

    Raises:
        RegionError: a start without an end, an end without a start, or a start inside a region.
    """
    regions: list[Region] = []
    offset, open_at = 0, None
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        start_tok, end_tok = _marker_comment(line, START), _marker_comment(line, END)
        if start_tok is not None:
            if open_at is not None:
                raise RegionError(f"{path}:{number}: {START} inside the region opened at line {open_at[1]}; close "
                                  f"it with {END} first")
            open_at = (offset + len(line), number, start_tok)
        elif end_tok is not None:
            if open_at is None:
                raise RegionError(f"{path}:{number}: {END} without an {START} before it")
            regions.append(Region(open_at[0], offset, open_at[1], open_at[2]))
            open_at = None
        offset += len(line)
    if open_at is not None:
        raise RegionError(f"{path}:{open_at[1]}: {START} is never closed; add a {END} comment after the region")
    return regions


def _code_spans(line: str, comment: str, open_: str | None) -> tuple[list[tuple[int, int]], str, str | None]:
    """The spans of ``line`` that are code (not comments or strings), the comment text of the line, and what is still
    open at its end: ``*/`` for a C-style block comment, the three quotes of a triple-quoted string of a ``#``-comment
    language (a Python docstring spanning lines), else None."""
    spans: list[tuple[int, int]] = []
    notes: list[str] = []
    c_style = comment == "//"
    i, n, begin = 0, len(line), 0
    if open_ is not None:
        close = line.find(open_)
        if close < 0:
            return [], (line if open_ == "*/" else ""), open_
        if open_ == "*/":
            notes.append(line[:close])
        i = begin = close + len(open_)
    while i < n:
        ch = line[i]
        if line.startswith(comment, i):
            spans.append((begin, i))
            notes.append(line[i + len(comment):])
            return spans, " ".join(notes), None
        if c_style and line.startswith("/*", i):
            spans.append((begin, i))
            close = line.find("*/", i + 2)
            if close < 0:
                notes.append(line[i + 2:])
                return spans, " ".join(notes), "*/"
            notes.append(line[i + 2:close])
            i = begin = close + 2
            continue
        triple = line[i:i + 3]
        if comment == "#" and triple in ('"""', "'''"):
            spans.append((begin, i))
            close = line.find(triple, i + 3)
            if close < 0:
                return spans, " ".join(notes), triple
            i = begin = close + 3
            continue
        if ch == '"' or ch == "'":
            close = i + 1
            while close < n and line[close] != ch:
                close += 2 if line[close] == "\\" else 1
            if ch == "'" and c_style and close - i > 5:  # not a character literal (a Rust lifetime, an apostrophe)
                i += 1
                continue
            spans.append((begin, i))
            i = begin = min(close + 1, n)
            continue
        i += 1
    spans.append((begin, n))
    return spans, " ".join(notes), None


def _number_value(core: str) -> tuple[float, bool]:
    digits = core.replace("_", "")
    is_int = not any(c in digits for c in ".eE")
    return (float(int(digits)) if is_int else float(digits)), is_int


def _default_bounds(value: float, is_int: bool) -> tuple[float, float]:
    if value == 0:
        return 0.0, 1.0
    high = 2.0 * value
    if is_int:
        high = max(high, 2.0)
    return 0.0, high


def _apply_item(item: str, lit: Literal, where: str) -> Literal | None:
    """``lit`` as an annotation item says (None for ``fixed``)."""
    name, low, high, scale = lit.name, lit.low, lit.high, lit.scale
    words = item.split()
    if any(w in ("fixed", "-") for w in words):
        if len(words) > 1:
            raise RegionError(f"{where}: annotation {item.strip()!r}: fixed stands alone (a fixed number has no name, "
                              "bounds or scale)")
        return None
    seen: dict[str, str] = {}
    for word in words:
        m = _RANGE.match(word)
        what = "log" if word == "log" else "LOW..HIGH" if m else "name" if word.isidentifier() else None
        if what is None:
            raise RegionError(f"{where}: annotation word {word!r} is not a name, LOW..HIGH, log or fixed")
        if what in seen:
            raise RegionError(f"{where}: annotation {item.strip()!r} gives a {what} twice ({seen[what]!r} and "
                              f"{word!r}); one item per number, separated by ';'")
        seen[what] = word
        if what == "log":
            scale = "log"
        elif m:
            low, high = float(m.group(1)), float(m.group(2))
        else:
            name = word
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise RegionError(f"{where}: parameter {name!r}: bounds {low:g}..{high:g} must be finite with LOW < HIGH")
    if not low <= lit.value <= high:
        raise RegionError(f"{where}: parameter {name!r}: the literal {lit.text} is outside its bounds "
                          f"{low:g}..{high:g}; widen them or change the literal")
    if scale == "log" and low <= 0:
        raise RegionError(f"{where}: parameter {name!r}: log needs LOW > 0, got {low:g}")
    return Literal(name, lit.start, lit.end, lit.line, lit.text, lit.value, lit.is_int, low, high, scale)


def _default_name(path: str, line: int, k: int) -> str:
    stem = re.sub(r"\W+", "_", path).strip("_") or "file"
    if stem[0].isdigit():
        stem = "f_" + stem
    return f"{stem}_L{line}" + (f"_{k + 1}" if k else "")


def extract(text: str, path: str = "<text>") -> list[Literal]:
    """The parameters of ``text``: every numeric literal in its marked regions that an annotation does not mark
    ``fixed``, in file order (see the module doc for names, bounds and annotations).

    Args:
        text: A source file's text.
        path: Its path as the folder names it (names default parameters, and messages).

    Raises:
        RegionError: as :func:`find_regions`, or a malformed annotation.
    """
    out: list[Literal] = []
    for region in find_regions(text, path):
        body = text[region.start:region.end]
        line_no = region.line + 1
        offset = region.start
        open_: str | None = None
        for line in body.splitlines(keepends=True):
            spans, notes, open_ = _code_spans(line, region.comment, open_)
            found: list[Literal] = []
            for a, b in spans:
                for m in _NUMBER.finditer(line, a, b):
                    value, is_int = _number_value(m.group("core"))
                    low, high = _default_bounds(value, is_int)
                    found.append(Literal(_default_name(path, line_no, len(found)), offset + m.start("core"),
                                         offset + m.end("core"), line_no, m.group("core"), value, is_int, low, high))
            ann = _ANNOTATION.search(notes)
            items = ann.group(1).split(";") if ann else []
            if len(items) > len(found):
                raise RegionError(f"{path}:{line_no}: the annotation has {len(items)} items for {len(found)} "
                                  "number(s) on its line")
            for k, lit in enumerate(found):
                kept = _apply_item(items[k], lit, f"{path}:{line_no}") if k < len(items) else lit
                if kept is not None:
                    out.append(kept)
            offset += len(line)
            line_no += 1
    return out


def format_value(value: float, is_int: bool) -> str:
    """A value as literal text: an int parameter rounded to the nearest integer (``12``), a float one as
    ``repr`` (the shortest text that reads back exactly, always with a ``.`` or an exponent: ``0.5``, ``2.0``,
    ``1e-05``); below zero in parentheses (``(-0.25)``), since the sign is not part of a literal."""
    v = float(value)
    if not math.isfinite(v):
        raise RegionError(f"cannot write {v} as a literal")
    text = str(round(v)) if is_int else repr(v)
    return f"({text})" if text.startswith("-") else text


def substitute(text: str, literals: Sequence[Literal], values: Mapping[str, float]) -> str:
    """``text`` with each literal named in ``values`` replaced by its value (:func:`format_value`); every other
    character is unchanged, so values equal to the literals' own give ``text`` back byte for byte where the
    literal was written as :func:`format_value` writes it.

    Args:
        text: The file's text, as :func:`extract` read it.
        literals: Its literals (:func:`extract`).
        values: Parameter name -> value; names of other files' parameters are ignored.
    """
    parts: list[str] = []
    at = 0
    for lit in sorted(literals, key=lambda x: x.start):
        if lit.name not in values:
            continue
        v = float(values[lit.name])
        same = (round(v) if lit.is_int else v) == lit.value
        new = lit.text if same else format_value(v, lit.is_int)  # the same number: kept as it was written
        parts += [text[at:lit.start], new]
        at = lit.end
    parts.append(text[at:])
    return "".join(parts)
