"""Program policies: a Python file with ``PARAMETERS`` and ``act()``; candidates; export.

A policy file looks like::

    PARAMETERS = {
        "angle_gain": {"default": 0.5, "low": 0.0, "high": 2.0},
        "rate": {"default": 1e-3, "low": 1e-5, "high": 1e-1, "scale": "log"},
    }

    def act(observation, params):      # params: dict name -> float
        ...
        return action

    def reset(params, seed):           # optional: fresh state for each episode
        ...

The parent process never executes policy code: this module reads the file with :mod:`ast` only
(``PARAMETERS`` must therefore be a literal). Worker processes compile and run it
(:func:`compile_policy`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratchet.errors import PolicyError

__all__ = ["Parameter", "PolicyProgram", "Candidate", "load_policy", "parse_policy", "export_source"]

_PARAM_KEYS = {"default", "low", "high", "scale"}


@dataclass(frozen=True)
class Parameter:
    """One tunable number of a policy.

    Attributes:
        name: Identifier used as the key in ``params``.
        default: Starting value (the value the unrefined policy uses).
        low: Lower bound, inclusive.
        high: Upper bound, inclusive; ``low < high``.
        scale: ``"linear"`` or ``"log"`` (log needs ``low > 0``); refiners search log-scaled
            parameters in log space.
    """

    name: str
    default: float
    low: float
    high: float
    scale: str = "linear"

    def to_unit(self, value: float) -> float:
        """Map ``value`` in ``[low, high]`` to ``[0, 1]`` (in log space for ``scale="log"``)."""
        if self.scale == "log":
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (value - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float:
        """Inverse of :meth:`to_unit`; ``u`` is clipped to ``[0, 1]`` first."""
        u = min(1.0, max(0.0, float(u)))
        if self.scale == "log":
            return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        return self.low + u * (self.high - self.low)


@dataclass(frozen=True)
class PolicyProgram:
    """A validated policy file: its source text and declared parameters (in file order)."""

    source: str
    parameters: tuple[Parameter, ...]
    path: str = "<string>"
    has_reset: bool = False

    @property
    def defaults(self) -> dict[str, float]:
        """Parameter name -> default value."""
        return {p.name: p.default for p in self.parameters}

    def candidate(self, params: Mapping[str, float] | None = None, *, parent_id: str | None = None,
                  refiner: str = "initial") -> Candidate:
        """Make a :class:`Candidate` of this program (defaults when ``params`` is None)."""
        values = dict(self.defaults if params is None else params)
        return Candidate.create(self.source, values, parent_id=parent_id, refiner=refiner)


def _candidate_id(source: str, params: Mapping[str, float]) -> str:
    blob = json.dumps({"source": source, "params": {k: repr(float(v)) for k, v in sorted(params.items())}},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Candidate:
    """An immutable policy candidate: (policy source, parameter values) plus provenance.

    ``id`` is derived from the content only (source and parameter values, 12 hex chars), so the same
    policy always has the same id. ``parent_id`` and ``refiner`` record where it came from.
    """

    id: str
    source: str
    params: Mapping[str, float] = field(hash=False)
    parent_id: str | None = None
    refiner: str = "initial"

    @classmethod
    def create(cls, source: str, params: Mapping[str, float], *, parent_id: str | None = None,
               refiner: str = "initial") -> Candidate:
        """Build a candidate, computing its content id. Values are stored as Python floats."""
        values = types.MappingProxyType({k: float(v) for k, v in params.items()})
        return cls(_candidate_id(source, values), source, values, parent_id, refiner)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (as stored in the ledger)."""
        return {"id": self.id, "source": self.source, "params": dict(self.params),
                "parent_id": self.parent_id, "refiner": self.refiner}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        """Inverse of :meth:`to_dict`; the id is recomputed and must match.

        Raises:
            PolicyError: if the stored id does not match the content.
        """
        cand = cls.create(d["source"], d["params"], parent_id=d.get("parent_id"), refiner=d.get("refiner", "initial"))
        if "id" in d and d["id"] != cand.id:
            raise PolicyError(f"candidate id {d['id']} does not match its content ({cand.id}); the ledger is corrupt")
        return cand


def load_policy(path: str | Path) -> PolicyProgram:
    """Read and validate a policy file without executing it.

    Args:
        path: Path to a ``.py`` file defining ``PARAMETERS`` and ``act``.

    Returns:
        The validated :class:`PolicyProgram`.

    Raises:
        PolicyError: file missing or unreadable, syntax error (with line number), no ``act``
            function, malformed ``PARAMETERS``, or a default outside its bounds.
    """
    p = Path(path)
    if not p.is_file():
        raise PolicyError(f"policy file not found: {p} (give the path to a .py file defining PARAMETERS and act)")
    if p.suffix in (".toml", ".json", ".yaml", ".yml"):
        raise PolicyError(f"{p} is a {p.suffix[1:]} file, not a policy; give the .py file defining PARAMETERS and act "
                          "(a ratchet.toml goes to `ratchet run`)")
    try:
        source = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy file {p}: {exc}") from exc
    return parse_policy(source, str(p))


def _find_parameters_node(tree: ast.Module) -> ast.expr | None:
    node = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PARAMETERS" for t in stmt.targets):
            node = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "PARAMETERS":
            node = stmt.value
    return node


def parse_policy(source: str, path: str = "<string>") -> PolicyProgram:
    """Validate policy source text (see :func:`load_policy`); never executes it.

    Raises:
        PolicyError: as :func:`load_policy`.
    """
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        where = f"{path}:{line}" if line else path
        raise PolicyError(f"{where}: syntax error: {getattr(exc, 'msg', None) or exc}") from None
    funcs = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    if "act" not in funcs:
        raise PolicyError(f"{path}: no top-level function act(observation, params); define one that returns an action")
    a = funcs["act"].args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    if (positional < 2 and a.vararg is None) or required > 2 or any(d is None for d in a.kw_defaults):
        raise PolicyError(f"{path}:{funcs['act'].lineno}: act must take two arguments (observation, params)")
    node = _find_parameters_node(tree)
    if node is None:
        raise PolicyError(f"{path}: no PARAMETERS; add e.g. PARAMETERS = {{\"gain\": {{\"default\": 1.0, \"low\": 0.0, \"high\": 2.0}}}}"
                          " (use PARAMETERS = {} for none)")
    if isinstance(node, ast.Dict):
        seen: set[object] = set()
        for key in node.keys:
            if isinstance(key, ast.Constant):
                if key.value in seen:
                    raise PolicyError(f"{path}:{key.lineno}: parameter {key.value!r} is declared twice in PARAMETERS")
                seen.add(key.value)
    try:
        raw = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise PolicyError(f"{path}:{node.lineno}: PARAMETERS must be a literal dict (ratchet reads it without running your code); "
                          "write numbers, not expressions or names") from None
    params = _validate_parameters(raw, path, node.lineno)
    return PolicyProgram(source=source, parameters=params, path=path, has_reset="reset" in funcs)


def _validate_parameters(raw: Any, path: str, lineno: int) -> tuple[Parameter, ...]:
    where = f"{path}:{lineno}"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: PARAMETERS must be a dict name -> {{default, low, high}}, got {type(raw).__name__}")
    out = []
    for name, spec in raw.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise PolicyError(f"{where}: parameter name {name!r} must be an identifier string")
        if isinstance(spec, (tuple, list)) and len(spec) == 3:
            spec = {"default": spec[0], "low": spec[1], "high": spec[2]}
        if not isinstance(spec, dict):
            raise PolicyError(f"{where}: parameter {name!r} must be a dict with default, low, high (or a tuple (default, low, high))")
        unknown = set(spec) - _PARAM_KEYS
        if unknown:
            raise PolicyError(f"{where}: parameter {name!r} has unknown key(s) {sorted(unknown)}; allowed: default, low, high, scale")
        missing = {"default", "low", "high"} - set(spec)
        if missing:
            raise PolicyError(f"{where}: parameter {name!r} is missing {sorted(missing)}; give default, low and high")
        vals = {}
        for key in ("default", "low", "high"):
            v = spec[key]
            try:
                ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
            except OverflowError:
                ok = False
            if not ok:
                hint = "; write it without quotes" if isinstance(v, str) else ""
                raise PolicyError(f"{where}: parameter {name!r}: {key} must be a finite number, got {repr(v)[:40]}{hint}")
            vals[key] = float(v)
        scale = spec.get("scale", "linear")
        if scale not in ("linear", "log"):
            raise PolicyError(f"{where}: parameter {name!r}: scale must be \"linear\" or \"log\", got {scale!r}")
        if not math.isfinite(vals["high"] - vals["low"]):
            raise PolicyError(f"{where}: parameter {name!r}: the range high - low overflows a float; use narrower "
                              "bounds or scale \"log\"")
        if not vals["low"] < vals["high"]:
            raise PolicyError(f"{where}: parameter {name!r}: low ({vals['low']}) must be below high ({vals['high']})")
        if not vals["low"] <= vals["default"] <= vals["high"]:
            raise PolicyError(f"{where}: parameter {name!r}: default {vals['default']} is outside its bounds "
                              f"[{vals['low']}, {vals['high']}]; widen the bounds or change the default")
        if scale == "log" and vals["low"] <= 0:
            raise PolicyError(f"{where}: parameter {name!r}: scale \"log\" needs low > 0, got {vals['low']}")
        out.append(Parameter(name, vals["default"], vals["low"], vals["high"], scale))
    return tuple(out)


def export_source(source: str, params: Mapping[str, float], *, header: str | None = None) -> str:
    """Rewrite ``source`` so each parameter's ``default`` is the given value.

    Only the default literals change (plus an optional header comment), so the result diffs cleanly
    against the original file.

    Raises:
        PolicyError: if ``source`` is not a valid policy or ``params`` names an unknown parameter.
    """
    parse_policy(source)
    tree = ast.parse(source)
    node = _find_parameters_node(tree)
    assert node is not None  # parse_policy checked
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []  # (line, col, end_col, text)
    declared = set()
    if isinstance(node, ast.Dict):
        for key, val in zip(node.keys, node.values):
            name = ast.literal_eval(key)
            declared.add(name)
            if name not in params:
                continue
            target = None
            if isinstance(val, ast.Dict):
                for k2, v2 in zip(val.keys, val.values):
                    if ast.literal_eval(k2) == "default":
                        target = v2
            elif isinstance(val, (ast.Tuple, ast.List)):
                target = val.elts[0]
            if target is None or target.lineno != target.end_lineno:
                raise PolicyError(f"cannot locate the default of parameter {name!r} to rewrite it")
            edits.append((target.lineno, target.col_offset, target.end_col_offset, repr(float(params[name]))))
    unknown = set(params) - declared
    if unknown:
        raise PolicyError(f"export: unknown parameter(s) {sorted(unknown)} for this policy")
    for lineno, col, end, text in sorted(edits, reverse=True):
        line = lines[lineno - 1].encode("utf-8")
        line = line[:col] + text.encode() + line[end:]
        lines[lineno - 1] = line.decode("utf-8")
    out = "".join(lines)
    if header:
        out = "".join(f"# {h}\n" for h in header.splitlines()) + out
    parse_policy(out)
    return out


def compile_policy(source: str | types.CodeType, filename: str = "<policy>") -> types.ModuleType:
    """Execute policy source (or its compiled code object) in a fresh module. Only workers call this.

    Raises:
        Exception: whatever the policy's top-level code raises (SyntaxError for bad source).
    """
    module = types.ModuleType("ratchet_policy")
    module.__file__ = filename
    code = source if isinstance(source, types.CodeType) else compile(source, filename, "exec")
    exec(code, module.__dict__)  # noqa: S102 - running policy code is the worker's job
    return module
