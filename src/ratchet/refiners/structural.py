"""What structural refiners (``mutate``, ``llm``) share: checking new policy source before any episode
runs, splicing edits into source text, parameter variants of a new program, and failed proposals.

A structural refiner returns candidates whose ``source`` is a new program. Before any episode runs,
the new source must pass :func:`check_source`: it parses, meets the policy-file contract
(:func:`ratchet.policy.parse_policy`: a literal ``PARAMETERS``, an ``act(observation, params)``),
and passes quick static checks that catch what would otherwise fail every episode (an undefined
name, a ``params["x"]`` that ``PARAMETERS`` does not declare, top-level code that would run on
import, an import outside a short allow-list). A source that fails is a :class:`Rejection`: the loop
records it (``proposal_rejected``) with its reason, and it never reaches a worker. The checks are not
the security boundary (workers are sandboxed and the env stays out of the policy's reach); they
keep machine-written mistakes from costing episodes.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ratchet.errors import PolicyError
from ratchet.policy import Candidate, PolicyProgram, export_source, parse_policy

__all__ = ["Rejection", "check_source", "program_of", "baked_source", "param_variants", "source_diff",
           "splice", "add_parameters", "MAX_SOURCE_CHARS", "ALLOWED_IMPORTS"]

#: Longest policy source a structural refiner may propose (characters).
MAX_SOURCE_CHARS = 200_000

#: Top-level modules a machine-written policy may import.
ALLOWED_IMPORTS = frozenset({"math", "numpy", "random", "itertools", "functools", "collections", "dataclasses",
                             "typing", "__future__", "statistics", "cmath", "operator", "enum"})

#: Names a policy module has without defining them (set by the worker before ``reset``/``act``).
_MODULE_NAMES = frozenset({"OBSERVATION_SPACE", "ACTION_SPACE", "__name__", "__file__", "__doc__"})

#: Attribute names a policy has no business touching (introspection escapes).
_FORBIDDEN_ATTRS = frozenset({"__class__", "__subclasses__", "__globals__", "__builtins__", "__code__", "__dict__",
                              "__bases__", "__mro__", "__getattribute__", "__closure__", "f_globals", "gi_frame"})
_FORBIDDEN_CALLS = frozenset({"exec", "eval", "compile", "open", "__import__", "input", "breakpoint", "globals",
                              "vars", "setattr", "delattr"})


@dataclass(frozen=True)
class Rejection:
    """A proposal that never ran: its source failed the checks, or there was no source at all
    (an LLM answer with no usable edit, a request that failed).

    Attributes:
        refiner: The refiner's arm name.
        parent_id: The candidate it was derived from.
        reason: One line: what is wrong.
        source: The rejected source, when there was one.
        detail: JSON-ready context (the mutation operator, the LLM exchange's key, ...).
    """

    refiner: str
    parent_id: str | None
    reason: str
    source: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


def check_source(source: str, *, dims: Mapping[str, int] | None = None) -> PolicyProgram:
    """Check new policy source without running it; return its program.

    Args:
        source: Policy file text.
        dims: The task's sizes (:func:`ratchet.policy.space_dims`) for shapes written as ``"obs"``/``"act"``.

    Returns:
        The parsed :class:`~ratchet.policy.PolicyProgram`.

    Raises:
        PolicyError: with a one-line reason: too long, a syntax error, the policy-file contract
            (:func:`~ratchet.policy.parse_policy`), top-level statements other than imports,
            assignments and definitions, a disallowed import or call, an undefined name, or a
            ``params[...]`` key ``PARAMETERS`` does not declare.
    """
    if not isinstance(source, str) or not source.strip():
        raise PolicyError("empty source")
    if len(source) > MAX_SOURCE_CHARS:
        raise PolicyError(f"source is {len(source):,} characters, more than the {MAX_SOURCE_CHARS:,} allowed")
    program = parse_policy(source, "<proposal>", dims=dims)
    tree = ast.parse(source)
    try:
        compile(tree, "<proposal>", "exec")  # compiles only (nothing runs): catches misplaced return/yield etc.
    except SyntaxError as exc:
        raise PolicyError(f"<proposal>:{exc.lineno}: {exc.msg}") from None
    for stmt in tree.body:
        ok = isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign,
                               ast.Pass)) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
        if not ok:
            raise PolicyError(f"<proposal>:{stmt.lineno}: top-level {type(stmt).__name__} statement; only imports, "
                              "assignments and definitions may run when the policy loads")
    act = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "act")
    inner = [n for n in ast.walk(act) if n is not act]
    if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in inner):
        raise PolicyError(f"<proposal>:{act.lineno}: act is a generator (it yields); it must return an action")
    if not any(isinstance(n, ast.Return) and n.value is not None for n in inner):
        raise PolicyError(f"<proposal>:{act.lineno}: act never returns an action (no return statement with a value)")
    star = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                if n.split(".")[0] not in ALLOWED_IMPORTS:
                    raise PolicyError(f"<proposal>:{node.lineno}: import of {n!r}; allowed: "
                                      f"{', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))}")
            star = star or any(a.name == "*" for a in node.names)
        elif isinstance(node, ast.Attribute) and node.attr in _FORBIDDEN_ATTRS:
            raise PolicyError(f"<proposal>:{node.lineno}: attribute {node.attr!r} is not allowed in a policy")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in _FORBIDDEN_CALLS):
            raise PolicyError(f"<proposal>:{node.lineno}: call to {node.func.id}() is not allowed in a policy")
    if not star:
        _check_names(tree)
    _check_params_keys(tree, {p.name for p in program.parameters})
    return program


def _check_names(tree: ast.Module) -> None:
    """Every name read is bound somewhere in the file, a builtin, or set by the worker (conservative:
    a name bound anywhere counts as bound everywhere, so this never rejects valid code for scoping)."""
    bound = set(dir(builtins)) | _MODULE_NAMES
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs) and node.name:
            bound.add(node.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
            raise PolicyError(f"<proposal>:{node.lineno}: name {node.id!r} is not defined")


def _check_params_keys(tree: ast.Module, declared: set[str]) -> None:
    """``params["x"]`` inside a function whose parameter is called ``params`` must name a declared parameter."""
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or "params" not in {a.arg for a in fn.args.args + fn.args.posonlyargs}:
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "params"
                    and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
                    and node.slice.value not in declared):
                raise PolicyError(f"<proposal>:{node.lineno}: params[{node.slice.value!r}] is not declared in "
                                  f"PARAMETERS (declared: {', '.join(sorted(declared)) or 'none'})")


def program_of(candidate: Candidate, dims: Mapping[str, int] | None = None) -> PolicyProgram:
    """The program a candidate runs (its own source, which a structural refiner may have changed).

    Raises:
        PolicyError: the source is not a valid policy.
    """
    return parse_policy(candidate.source, "<candidate>", dims=dims or _dims_of(candidate))


def _dims_of(candidate: Candidate) -> dict[str, int] | None:
    from ratchet.policy import _infer_dims

    return _infer_dims(candidate.source, candidate.params)


def baked_source(candidate: Candidate) -> str:
    """The candidate's source with its parameter values written in as the defaults
    (:func:`ratchet.policy.export_source`): the starting point of a structural edit, so a new program's
    defaults are the parent's tuned values."""
    return export_source(candidate.source, candidate.params) if candidate.params else candidate.source


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
    fresh = set(fresh)
    for _ in range(max(0, n - 1)):
        values: dict[str, Any] = {}
        for p in program.parameters:
            if p.name in fresh:
                u = rng.uniform(0.0, 1.0, size=p.size)
            else:
                u = np.asarray(p.to_unit(middle[p.name]), dtype=np.float64).reshape(-1)
                u = u + rng.normal(0.0, sigma, size=p.size)
            values[p.name] = p.from_unit(u if p.is_array else float(u[0]))
        if values and values not in out:
            out.append(values)
    return out


def source_diff(old: str, new: str, max_lines: int = 80) -> str:
    """A unified diff ``old`` -> ``new`` (at most ``max_lines`` lines, then ``...``)."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), "parent", "candidate", lineterm="", n=1))
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)


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
            edits.append(((last.end_lineno, last.end_col_offset), (last.end_lineno, last.end_col_offset),
                          "," + text.rstrip(",")))
        else:  # PARAMETERS = {}
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
