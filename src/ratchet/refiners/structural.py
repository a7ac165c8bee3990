"""What structural refiners (``mutate``, ``llm``) share: splicing edits into source text, new
parameters, and parameter variants of a new program.

The checks every new source passes before any episode runs (:func:`~ratchet.proposals.check_source`),
the failed-proposal record (:class:`~ratchet.proposals.Rejection`), :func:`~ratchet.proposals.baked_source`
and :func:`~ratchet.proposals.source_diff` belong to no refiner kind: they live in
:mod:`ratchet.proposals`, which the loop uses too, and are named here as well.
"""

from __future__ import annotations

import ast
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ratchet.errors import PolicyError
from ratchet.policy import Candidate, PolicyProgram, parse_policy

# the neutral parts (the loop uses them too) live in ratchet.proposals; named here for the refiners
from ratchet.proposals import ALLOWED_IMPORTS, MAX_SOURCE_CHARS, Rejection, baked_source, check_source, source_diff

__all__ = [
    "ALLOWED_IMPORTS",
    "MAX_SOURCE_CHARS",
    "Rejection",
    "add_parameters",
    "baked_source",
    "check_source",
    "param_variants",
    "program_of",
    "source_diff",
    "splice",
]

def program_of(candidate: Candidate, dims: Mapping[str, int] | None = None) -> PolicyProgram:
    """The program a candidate runs (its own source, which a structural refiner may have changed).

    Raises:
        PolicyError: the source is not a valid policy.
    """
    return parse_policy(candidate.source, "<candidate>", dims=dims or _dims_of(candidate), functions=None)


def _dims_of(candidate: Candidate) -> dict[str, int] | None:
    from ratchet.policy import _infer_dims

    return _infer_dims(candidate.source, candidate.params)


def param_variants(program: PolicyProgram, rng: np.random.Generator, n: int, fresh: Sequence[str] = (),
                   sigma: float = 0.15, center: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``n`` parameter settings of a new program, to try it with more than one set of numbers.

    The first is ``center`` (default: the program's defaults). In the others, each parameter named in
    ``fresh`` (introduced by the edit, whose default is often a neutral value such as a zero weight) is
    drawn uniformly in its bounds, and every other parameter is perturbed around its ``center`` value by
    a Gaussian of ``sigma`` in normalised units (a fraction of its range; log space for ``scale="log"``),
    clipped to its bounds.

    Returns:
        ``n`` dicts name -> value (duplicates removed, so possibly fewer when there is nothing to vary).
    """
    middle = dict(program.defaults if center is None else center)
    out: list[dict[str, Any]] = [middle]
    fresh_names = set(fresh)
    for _ in range(max(0, n - 1)):
        values: dict[str, Any] = {}
        for p in program.parameters:
            if p.name in fresh_names:
                u = rng.uniform(0.0, 1.0, size=p.size)
            else:
                u = np.asarray(p.to_unit(middle[p.name]), dtype=np.float64).reshape(-1)
                u = u + rng.normal(0.0, sigma, size=p.size)
            values[p.name] = p.from_unit(u if p.is_array else float(u[0]))
        if values and values not in out:
            out.append(values)
    return out


def digest(text: str) -> str:
    """SHA-256 hex of ``text`` (UTF-8), 12 characters."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# -- splicing edits into source text ------------------------------------------------------------------

def _offsets(source: str) -> list[int]:
    """Byte offset of each line's start (ast columns count UTF-8 bytes)."""
    starts = [0]
    for line in source.encode("utf-8").splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def splice(source: str, edits: Sequence[tuple[tuple[int, int], tuple[int, int], str]]) -> str:
    """Apply text edits given in ast coordinates: each ``((line, col), (end_line, end_col), text)``
    replaces that span (1-based lines, UTF-8 byte columns, as in :mod:`ast`) by ``text``. Spans must
    not overlap; they are applied from the last to the first."""
    starts = _offsets(source)
    data = source.encode("utf-8")
    spans = [(starts[a[0] - 1] + a[1], starts[b[0] - 1] + b[1], t) for a, b, t in edits]
    for lo, hi, text in sorted(spans, key=lambda s: (s[0], s[1]), reverse=True):
        data = data[:lo] + text.encode("utf-8") + data[hi:]
    return data.decode("utf-8")


def _fmt(v: float) -> str:
    return repr(float(v))


def parameter_entry(name: str, default: float, low: float, high: float) -> str:
    """One ``PARAMETERS`` entry's text."""
    return f'"{name}": {{"default": {_fmt(default)}, "low": {_fmt(low)}, "high": {_fmt(high)}}}'


def add_parameters(source: str, entries: Mapping[str, tuple[float, float, float]],
                   other_edits: Sequence[tuple[tuple[int, int], tuple[int, int], str]] = ()) -> str:
    """Add scalar parameters ``name -> (default, low, high)`` to ``PARAMETERS`` (after its last entry,
    one per line), together with ``other_edits`` (see :func:`splice`) elsewhere in the file.

    Raises:
        PolicyError: ``PARAMETERS`` is not a dict display (e.g. built by ``dict(...)``).
    """
    from ratchet.policy import _find_parameters_node

    tree = ast.parse(source)
    node = _find_parameters_node(tree)
    if not isinstance(node, ast.Dict):
        raise PolicyError("PARAMETERS is not a dict display; cannot add a parameter")
    edits = list(other_edits)
    if entries:
        text = "".join(f"\n    {parameter_entry(n, *v)}," for n, v in entries.items())
        if node.values:
            last = node.values[-1]
            assert last.end_lineno is not None and last.end_col_offset is not None  # ast.parse sets positions
            edits.append(((last.end_lineno, last.end_col_offset), (last.end_lineno, last.end_col_offset),
                          "," + text.rstrip(",")))
        else:  # PARAMETERS = {}
            assert node.end_lineno is not None and node.end_col_offset is not None  # ast.parse sets positions
            edits.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset),
                          "{" + text + "\n}"))
    return splice(source, edits)


def fresh_name(prefix: str, taken: set[str]) -> str:
    """``prefix_1``, ``prefix_2``, ... : the first not in ``taken``."""
    i = 1
    while f"{prefix}_{i}" in taken:
        i += 1
    return f"{prefix}_{i}"


def bounds_around(value: float) -> tuple[float, float]:
    """Bounds for a constant turned into a parameter: the same sign, up to twice its size
    (``[-1, 1]`` for zero)."""
    v = float(value)
    if v == 0 or not math.isfinite(v):
        return -1.0, 1.0
    return (0.0, 2 * v) if v > 0 else (2 * v, 0.0)
