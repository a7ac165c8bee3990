"""Program policies: a Python file with ``PARAMETERS`` and ``act()``; candidates; export.

A policy file looks like::

    PARAMETERS = {
        "angle_gain": {"default": 0.5, "low": 0.0, "high": 2.0},
        "rate": {"default": 1e-3, "low": 1e-5, "high": 1e-1, "scale": "log"},
    }

    def act(observation, params):      # params: dict name -> float (or numpy array, see below)
        ...
        return action

    def reset(params, seed):           # optional: fresh state for each episode
        ...

A parameter with a ``"shape"`` is an *array parameter*: ``{"shape": [8, 2], "default": 0.0, "low": -1.0,
"high": 1.0}`` gives ``act`` a float64 :class:`numpy.ndarray` of shape ``(8, 2)``. Its ``default``,
``low`` and ``high`` are each a number (the same for every element) or a nested list of that shape.
Candidates hold array values as nested tuples of floats (immutable, JSON-ready as nested lists);
workers turn them into arrays with :func:`materialize` just before ``reset``/``act``.

A parameter may declare a ``"type"``: ``"float"`` (the default, everything above), ``"int"`` or
``"categorical"``::

    PARAMETERS = {
        "depth": {"type": "int", "default": 3, "low": 1, "high": 8},          # act gets a Python int
        "width": {"type": "int", "default": 64, "low": 8, "high": 512, "scale": "log"},
        "rule": {"type": "categorical", "choices": ["greedy", "sorted", 2, True], "default": "greedy"},
    }

An int parameter's ``default``, ``low`` and ``high`` are integers (within ±2**53, so every float search maps them
exactly); it takes no ``shape`` (declare one int per number, or a float array rounded in ``act``) and ``scale="log"``
needs ``low >= 1``. A categorical parameter lists its ``choices`` (two or more distinct strings, numbers or booleans:
JSON's literals) and its ``default`` among them; ``act`` gets the choice itself. Candidates hold ints as Python ints
and choices as themselves, and :meth:`Parameter.to_unit`/:meth:`Parameter.from_unit` map both to and from a unit
interval as floats are (a relaxed space, rounded: see :class:`Parameter`), so every refiner that tunes numbers
tunes them unchanged.

Before an episode's ``reset``/first ``act`` the worker sets the module globals ``OBSERVATION_SPACE``
and ``ACTION_SPACE`` to the task's Gymnasium spaces (:func:`bind_spaces`), so one policy file can scale
itself to any environment.

The parent process never executes policy code: this module reads the file with :mod:`ast` only
(``PARAMETERS`` must therefore be a literal). Worker processes compile and run it
(:func:`compile_policy`).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import hashlib
import json
import math
import numbers
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratchet.errors import PolicyError

__all__ = [
    "FOLDER_KINDS",
    "MAX_PARAMETER_NUMBERS",
    "PARAMETER_TYPES",
    "POLICY_KINDS",
    "SOURCE_KINDS",
    "SPACE_KINDS",
    "TASK_DIMS",
    "Candidate",
    "Parameter",
    "PolicyProgram",
    "bind_spaces",
    "describe_value",
    "export_source",
    "load_policy",
    "materialize",
    "parse_policy",
    "space_dims",
    "typed_parameters",
    "uses_global_random",
    "uses_task_dims",
]

_PARAM_KEYS = {"default", "low", "high", "scale", "shape", "type", "choices"}

#: The types a parameter may declare (``"type"``; ``"float"`` when left out).
PARAMETER_TYPES = ("float", "int", "categorical")

#: Largest magnitude of an int parameter's bounds: every integer up to it is exact as a float (the unit mapping).
MAX_INT = 2**53

#: Most numbers all of a policy's parameters may hold together (scalars count 1, arrays their size).
#: Every candidate's values go through the ledger as JSON, so this bounds a candidate's record (≈ 2 MB).
MAX_PARAMETER_NUMBERS = 100_000

#: Names an array shape may use for the task's sizes: ``"obs"`` (flattened observation) and ``"act"``
#: (flattened action: ``n`` for a Discrete space); see :func:`space_dims`.
TASK_DIMS = ("obs", "act")

#: A parameter value: a float (scalar parameter), nested tuples of floats of the declared shape (array parameter),
#: an int (int parameter) or one of the choices (categorical parameter: text, a number or a bool).
Value = Any


@dataclass(frozen=True)
class Parameter:
    """One tunable number, array of numbers, integer or choice of a policy.

    Attributes:
        name: Identifier used as the key in ``params``.
        default: Starting value (the value the unrefined policy uses): a float, or for an array
            parameter a float (every element) or nested tuples of floats of ``shape``; an int for an int
            parameter; one of ``choices`` for a categorical one.
        low: Lower bound, inclusive; float or nested tuples like ``default`` (an int for an int parameter;
            None for a categorical one).
        high: Upper bound, inclusive; ``low < high`` (elementwise); None for a categorical parameter.
        scale: ``"linear"`` or ``"log"`` (log needs ``low > 0``, for an int ``low >= 1``); refiners search
            log-scaled parameters in log space.
        shape: ``()`` for a scalar; otherwise the array's shape (every dimension ≥ 1; float parameters only).
        type: ``"float"``, ``"int"`` or ``"categorical"`` (:data:`PARAMETER_TYPES`).
        choices: A categorical parameter's choices in declaration order (strings, numbers, bools); ``()`` otherwise.

    The unit mapping (:meth:`to_unit`, :meth:`from_unit`) is what every refiner that tunes numbers searches
    (CMA-ES, the perturbations of ``mutate`` and ``llm``), so it is the one place that knows the types:

    - float: ``[low, high]`` onto ``[0, 1]``, linearly or in log space.
    - int: a relaxed continuous range ``[low - 0.5, high + 0.5]`` (its logarithm for ``scale="log"``) onto
      ``[0, 1]``, rounded to the nearest integer on the way back. Each of the ``high - low + 1`` integers owns an
      equal share of the relaxed range, and :meth:`to_unit` gives an integer its share's centre, so
      ``from_unit(to_unit(v)) == v``. A search runs on the continuous relaxation and the candidate is its
      rounding: the integer handling of CMA-ES by rounding (N. Hansen, "A CMA-ES for Mixed-Integer Nonlinear
      Optimization", INRIA RR-7751, 2011, with a lower bound on the integer coordinates' step size, which the
      ``cmaes`` refiner sets) and the relaxation Optuna's search-space transform uses for ``suggest_int``
      (``optuna._transform._SearchSpaceTransform``: bounds widened by half a step, log space for ``log=True``). CMA-ES with margin (Hamano et al., GECCO 2022) would adapt that lower
      bound per coordinate; rounding with a fixed floor is the simpler, documented baseline.
    - categorical: ``[0, 1]`` split in ``len(choices)`` equal bins in declaration order; a choice maps to its
      bin's centre and a point to the choice whose bin holds it. One coordinate per parameter keeps the
      contract every refiner relies on (a scalar parameter is one float in ``[0, 1]``); a one-hot relaxation
      (one coordinate per choice, the largest wins, as Optuna's transform encodes choices) would impose no order but
      make a scalar parameter many numbers for every refiner. The order matters to local search (a small step moves to a neighbouring
      choice), so list ordered choices in their order.
    """

    name: str
    default: Value
    low: Value
    high: Value
    scale: str = "linear"
    shape: tuple[int, ...] = ()
    type: str = "float"
    choices: tuple[Any, ...] = ()

    @property
    def size(self) -> int:
        """Numbers this parameter holds: 1 for a scalar (an int, a choice), the product of ``shape`` for an array."""
        return math.prod(self.shape)

    @property
    def is_array(self) -> bool:
        """True for an array parameter (declared with a ``shape``)."""
        return self.shape != ()

    def array(self, which: str) -> Any:
        """``default``, ``low`` or ``high`` as a float64 ndarray of ``shape`` (scalars broadcast; float parameters)."""
        import numpy as np

        return np.broadcast_to(np.asarray(getattr(self, which), dtype=np.float64), self.shape).copy()

    @property
    def default_value(self) -> Value:
        """The default as a candidate holds it: a float, nested tuples of ``shape``, an int or the choice."""
        if self.is_array:
            return _freeze(self.array("default"))
        return float(self.default) if self.type == "float" else self.default

    def describe(self) -> str:
        """What values the parameter takes, in words: ``float in [0, 2]``, ``float array [8, 2] in [-1, 1]``,
        ``int in [1, 8]`` (``, log scale`` where it is), ``one of 'greedy', 'sorted', 2``."""
        if self.type == "categorical":
            return "one of " + _cut(", ".join(_literal(c) for c in self.choices), 300)
        log = ", log scale" if self.scale == "log" else ""
        if self.type == "int":
            return f"int in [{self.low}, {self.high}]{log}"
        if self.is_array:
            lo, hi = self.array("low"), self.array("high")
            return f"float array {list(self.shape)} in [{lo.min():g}, {hi.max():g}]{log}"
        return f"float in [{self.low:g}, {self.high:g}]{log}"

    def index(self, value: Any) -> int:
        """Position of ``value`` among a categorical parameter's ``choices``: the choice equal to it and of its kind
        (a bool matches only a bool, a number only a number, text only text: ``1 == True`` in Python).

        Raises:
            PolicyError: ``value`` is not one of the choices.
        """
        for i, c in enumerate(self.choices):
            if _same_literal(c, value):
                return i
        raise PolicyError(f"parameter {self.name!r}: {_cut(repr(value), 60)} is not one of its choices "
                          f"{_cut(', '.join(_literal(c) for c in self.choices), 200)}")

    def coerce(self, value: Any) -> Value:
        """``value`` as a candidate holds it: a float (any real number; nested tuples of floats for an array), an int
        (a whole number: ``3.0`` gives ``3``) or the choice itself (``2.0`` gives an int choice ``2``).

        Raises:
            PolicyError: a value of another type: text or a bool for a number, a fraction for an int, anything
                that is not one of the choices.
        """
        if self.type == "categorical":
            return self.choices[self.index(value)]
        if self.type == "int":
            if isinstance(value, numbers.Integral) and not _is_bool(value):
                return int(value)
            if isinstance(value, numbers.Real) and not _is_bool(value) and math.isfinite(value) \
                    and float(value).is_integer():
                return int(float(value))
            raise PolicyError(f"parameter {self.name!r}: {_cut(repr(value), 60)} is not an integer")
        if self.is_array:
            return _value(value)
        if isinstance(value, numbers.Real) and not _is_bool(value):
            return float(value)
        raise PolicyError(f"parameter {self.name!r}: {_cut(repr(value), 60)} is not a number")

    def problem(self, value: Any) -> str | None:
        """Why ``value``, as a candidate holds it, is not one this parameter takes (None when it is): text that
        follows the parameter's name, e.g. ``"is outside its bounds [0.0, 1.0]"``, ``"is 2.5, not an integer"``."""
        if self.type == "categorical":
            if any(_same_literal(c, value) for c in self.choices):
                return None
            return (f"is {_cut(repr(value), 60)}, not one of its choices "
                    f"{_cut(', '.join(_literal(c) for c in self.choices), 200)}")
        if self.type == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                return f"is {_cut(repr(value), 60)}, not an integer"
            return None if self.low <= value <= self.high else f"is outside its bounds [{self.low}, {self.high}]"
        import numpy as np

        if not self.is_array and not (isinstance(value, numbers.Real) and not _is_bool(value)):
            return f"is {_cut(repr(value), 60)}, not a number"
        try:
            u = np.asarray(self.to_unit(value), dtype=np.float64)
        except (TypeError, ValueError):
            return f"is not an array of numbers of shape {list(self.shape)}"
        if not np.all(np.isfinite(u)) or np.any(u < -1e-9) or np.any(u > 1 + 1e-9):
            return f"is outside its bounds [{self.low}, {self.high}]"
        return None

    def to_unit(self, value: Value) -> Any:
        """Map ``value`` in ``[low, high]`` (an int, a choice) to ``[0, 1]`` (in log space for ``scale="log"``; an
        int or a choice to the centre of its bin, see the class doc).

        Returns a float for a scalar parameter, a flat float64 array of ``size`` for an array one.

        Raises:
            PolicyError: a categorical parameter's value that is not one of its choices.
        """
        if self.type == "categorical":
            return (self.index(value) + 0.5) / len(self.choices)
        if self.type == "int":
            a, b = self._relaxed()
            return ((math.log(value) if self.scale == "log" else value) - a) / (b - a)
        if not self.is_array:
            if self.scale == "log":
                return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
            return (value - self.low) / (self.high - self.low)
        import numpy as np

        v, lo, hi = (np.asarray(x, dtype=np.float64).reshape(-1) for x in
                     (value, self.array("low"), self.array("high")))
        if self.scale == "log":
            v, lo, hi = np.log(v), np.log(lo), np.log(hi)
        return (v - lo) / (hi - lo)

    def from_unit(self, u: Any) -> Value:
        """Inverse of :meth:`to_unit`; ``u`` is clipped to ``[0, 1]`` first.

        Args:
            u: A float for a scalar parameter; ``size`` floats (any shape) for an array one.

        Returns:
            A float, nested tuples of floats of ``shape``, a Python int within ``[low, high]`` (the relaxed value
            rounded) or one of the choices.
        """
        if not self.is_array:
            u = min(1.0, max(0.0, float(u)))
            if self.type == "categorical":
                return self.choices[min(len(self.choices) - 1, int(u * len(self.choices)))]
            if self.type == "int":
                a, b = self._relaxed()
                x = a + u * (b - a)
                return min(self.high, max(self.low, math.floor((math.exp(x) if self.scale == "log" else x) + 0.5)))
            if self.scale == "log":
                return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
            return self.low + u * (self.high - self.low)
        import numpy as np

        u = np.clip(np.asarray(u, dtype=np.float64).reshape(self.shape), 0.0, 1.0)
        lo, hi = self.array("low"), self.array("high")
        if self.scale == "log":
            out = np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo)))
        else:
            out = lo + u * (hi - lo)
        return _freeze(np.clip(out, lo, hi))  # rounding must never step outside the bounds

    def _relaxed(self) -> tuple[float, float]:
        """An int parameter's relaxed range ``[low - 0.5, high + 0.5]``, as logarithms for ``scale="log"``."""
        lo, hi = self.low - 0.5, self.high + 0.5
        return (math.log(lo), math.log(hi)) if self.scale == "log" else (lo, hi)


def _is_bool(v: Any) -> bool:
    """A Python or NumPy bool (both compare equal to 0 and 1; NumPy's is ``numpy.bool``, ``numpy.bool_`` before 2.0)."""
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_"))


def _kind(v: Any) -> str | None:
    """A choice's kind as JSON tells them apart: ``"bool"``, ``"number"``, ``"text"``; None for anything else."""
    if _is_bool(v):
        return "bool"
    if isinstance(v, numbers.Real):
        return "number"
    return "text" if isinstance(v, str) else None


def _same_literal(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same choice: equal and of the same kind (:func:`_kind`)."""
    return _kind(a) is not None and _kind(a) == _kind(b) and a == b


def _literal(v: Any) -> str:
    """A scalar value as Python source writes it: ``repr`` of a float, int, bool or text (reads back exactly)."""
    if _is_bool(v):
        return repr(bool(v))
    if isinstance(v, numbers.Integral):
        return repr(int(v))
    return repr(v) if isinstance(v, str) else repr(float(v))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _freeze(a: Any) -> Value:
    """An ndarray (or nested sequence) as nested tuples of Python floats; a 0-d value as a float."""
    import numpy as np

    def tup(x: Any) -> Any:
        return tuple(tup(y) for y in x) if isinstance(x, list) else float(x)

    return tup(np.asarray(a, dtype=np.float64).tolist())


def _thaw(v: Value) -> Any:
    """Nested tuples as nested lists (JSON's shape); floats unchanged."""
    return [_thaw(x) for x in v] if isinstance(v, (tuple, list)) else v


def materialize(params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter values as a policy sees them: array values become float64 ndarrays, scalars floats.

    Runs in the worker just before ``reset``/``act``. The shape comes from the nesting of the value,
    which the driver validated against the declaration when it made the candidate (every dimension is
    at least 1, so nesting determines the shape). Each call returns fresh arrays, so a policy that
    writes into its arrays cannot change the next episode's parameters.

    Args:
        params: name -> float, or nested lists/tuples of floats.

    Returns:
        A new dict name -> float or ``numpy.ndarray`` (float64).
    """
    import numpy as np

    return {k: np.array(v, dtype=np.float64) if isinstance(v, (list, tuple)) else v for k, v in params.items()}


def space_dims(observation_space: Any, action_space: Any) -> dict[str, int]:
    """The sizes ``"obs"`` and ``"act"`` an array shape may name: each space's
    :func:`gymnasium.spaces.flatdim` (a Box's element count; a Discrete space's ``n``)."""
    from gymnasium.spaces import flatdim

    return {"obs": int(flatdim(observation_space)), "act": int(flatdim(action_space))}


def uses_task_dims(source: str) -> bool:
    """Whether a policy's ``PARAMETERS`` write a shape relative to the task's spaces (``"obs"``/``"act"``);
    False also for invalid source (:func:`parse_policy` then says what is wrong)."""
    raw = _raw_parameters(source)
    return any(isinstance(spec, dict) and isinstance(spec.get("shape"), (list, tuple))
               and any(d in TASK_DIMS for d in spec["shape"]) for spec in raw.values())


def _raw_parameters(source: str) -> dict[str, Any]:
    try:
        node = _find_parameters_node(ast.parse(source))
        raw = ast.literal_eval(node) if node is not None else {}
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return {}
    return raw if isinstance(raw, dict) else {}


def typed_parameters(source: str) -> list[Parameter]:
    """The int and categorical parameters ``source`` declares validly, in file order (for prompts and tables that
    say what values they take); none for a source whose ``PARAMETERS`` do not read. Never executes the source."""
    out: list[Parameter] = []
    for name, spec in _raw_parameters(source).items():
        if isinstance(spec, dict) and spec.get("type") in ("int", "categorical"):
            try:
                out += _validate_parameters({name: spec}, "<policy>", 0)
            except PolicyError:
                continue
    return out


def _infer_dims(source: str, params: Mapping[str, Any]) -> dict[str, int] | None:
    """The task dims implied by array values whose declared shape names ``"obs"``/``"act"`` (for export)."""
    import numpy as np

    dims: dict[str, int] = {}
    for name, spec in _raw_parameters(source).items():
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if isinstance(shape, (list, tuple)) and name in params:
            got = np.shape(params[name])
            for d, n in zip(shape, got):
                if d in TASK_DIMS:
                    dims.setdefault(d, int(n))
    return dims or None


def bind_spaces(module: Any, observation_space: Any, action_space: Any) -> None:
    """Give a loaded policy module the task's spaces as the globals ``OBSERVATION_SPACE`` and
    ``ACTION_SPACE`` (Gymnasium space objects). Workers call this before each episode's ``reset``."""
    module.OBSERVATION_SPACE = observation_space
    module.ACTION_SPACE = action_space


def describe_value(value: Any) -> str:
    """A one-line summary of a parameter value for tables: the number itself for a scalar (6 significant digits;
    an int in full); a choice as its literal (``'greedy'``, ``True``); the elements of a small array (at most 6);
    otherwise ``"array [8, 2]: min -0.41, mean 0.02, max 0.93, norm 1.87"`` (norm: Euclidean, over all elements)."""
    import numpy as np

    if _is_bool(value) or isinstance(value, (str, numbers.Integral)):
        return _cut(_literal(value), 200)
    if not isinstance(value, (list, tuple, np.ndarray)):
        return f"{float(value):.6g}"
    a = np.asarray(value, dtype=np.float64)
    if a.size <= 6:
        return f"array {list(a.shape)}: " + ", ".join(f"{x:.4g}" for x in a.ravel())
    return (f"array {list(a.shape)}: min {a.min():.4g}, mean {a.mean():.4g}, max {a.max():.4g}, "
            f"norm {float(np.linalg.norm(a)):.4g}")


@dataclass(frozen=True)
class PolicyProgram:
    """A validated policy file: its source text and declared parameters (in file order)."""

    source: str
    parameters: tuple[Parameter, ...]
    path: str = "<string>"
    has_reset: bool = False

    @property
    def defaults(self) -> dict[str, Value]:
        """Parameter name -> default value (array defaults as nested tuples of the full shape; ints as ints,
        choices as themselves)."""
        return {p.name: p.default_value for p in self.parameters}

    def candidate(self, params: Mapping[str, Any] | None = None, *, parent_id: str | None = None,
                  refiner: str = "initial") -> Candidate:
        """Make a :class:`Candidate` of this program (defaults when ``params`` is None), each value in its
        parameter's form (:meth:`Parameter.coerce`: ``1`` for a float parameter is ``1.0``, ``3.0`` for an int one
        ``3``).

        Raises:
            PolicyError: an array value whose shape is not the declared one, or a value of another type (text for a
                number, a fraction for an int, what is not one of a categorical parameter's choices).
        """
        values = dict(self.defaults if params is None else params)
        import numpy as np

        for p in self.parameters:
            if p.name not in values:
                continue
            if p.is_array and np.shape(values[p.name]) != p.shape:
                raise PolicyError(f"parameter {p.name!r}: expected an array of shape {list(p.shape)}, "
                                  f"got shape {list(np.shape(values[p.name]))}")
            values[p.name] = p.coerce(values[p.name])
        return Candidate.create(self.source, values, parent_id=parent_id, refiner=refiner)


def _id_repr(v: Any) -> Any:
    """A value as its candidate's id hashes it: a float as ``repr`` (as ever: ids of float candidates never change),
    an int, a bool or text tagged with its kind (``{"int": 3}``), so no two kinds share a form."""
    if isinstance(v, (tuple, list)):
        return [_id_repr(x) for x in v]
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    return {"str": v} if isinstance(v, str) else repr(float(v))


def _candidate_id(source: str, params: Mapping[str, Any], kind: str = "program",
                  artifacts: Mapping[str, str] | None = None) -> str:
    # scalars hash as repr(float): ids of scalar-only candidates are those of earlier versions (ledgers resume);
    # a program candidate without artifacts hashes as before policy kinds existed
    content: dict[str, Any] = {"source": source, "params": {k: _id_repr(v) for k, v in sorted(params.items())}}
    if kind != "program" or artifacts:
        content.update(kind=kind, artifacts=dict(sorted((artifacts or {}).items())))
    blob = json.dumps(content, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _value(v: Any) -> Value:
    """A candidate's stored form of a value: a float, nested tuples of floats for anything array-like, and an int,
    a bool or text as itself (an int or a categorical parameter's value; :meth:`Parameter.coerce` gives each
    parameter's own form, and :meth:`PolicyProgram.candidate` applies it)."""
    if type(v) is float:
        return v
    if _is_bool(v):
        return bool(v)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    import numpy as np

    if isinstance(v, (list, tuple, np.ndarray)):
        try:
            a = np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError):
            raise PolicyError(f"parameter value must be a number or a rectangular nested list of numbers, "
                              f"got {str(v)[:40]}") from None
        if a.ndim == 0:
            return float(a)
        return _freeze(a)
    return float(v)


#: Policy kinds a candidate can be (see :mod:`ratchet.policies`).
POLICY_KINDS = ("program", "mlp", "sb3", "residual", "source")
#: Policy kinds whose candidates carry a program's source and its ``PARAMETERS`` (checked, searched, edited).
SOURCE_KINDS = frozenset({"program", "residual"})
#: Policy kinds whose candidate is a folder of source files in any language, its parameters the numbers of its
#: marked regions (:mod:`ratchet.policies.source`, :mod:`ratchet.regions`).
FOLDER_KINDS = frozenset({"source"})
#: Policy kinds whose starting network is sized to the task's observation and action spaces.
SPACE_KINDS = frozenset({"mlp", "residual"})


@dataclass(frozen=True)
class Candidate:
    """An immutable policy candidate: its kind, policy source, parameter values and artifacts, plus provenance.

    ``id`` is derived from the content only (kind, source, parameter values and artifact hashes; 12 hex
    chars), so the same policy always has the same id. ``parent_id`` and ``refiner`` record where it
    came from.

    Attributes:
        kind: ``"program"`` (a policy file), ``"mlp"`` (a network whose weights are an artifact),
            ``"sb3"`` (a Stable-Baselines3 ``.zip``, opened only inside sandboxed workers) or
            ``"residual"`` (a program plus a learned correction) or ``"source"`` (a folder of source files in any
            language, its source a JSON document of them); see :mod:`ratchet.policies`.
        artifacts: Role -> SHA-256 hex digest of immutable bytes kept in the run's artifact store
            (:meth:`ratchet.ledger.LedgerStore.put_artifact`), e.g. ``{"weights": "ab12..."}``.
    """

    id: str
    source: str
    params: Mapping[str, Value] = field(hash=False)
    parent_id: str | None = None
    refiner: str = "initial"
    kind: str = "program"
    artifacts: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}), hash=False)

    @classmethod
    def create(cls, source: str, params: Mapping[str, Any], *, parent_id: str | None = None,
               refiner: str = "initial", kind: str = "program",
               artifacts: Mapping[str, str] | None = None) -> Candidate:
        """Build a candidate, computing its content id.

        Real numbers are stored as Python floats and array values (lists, tuples, ndarrays) as nested
        tuples of floats, so a candidate stays immutable; ints, bools and text (the values of int and categorical
        parameters) are stored as themselves (:func:`_value`; :meth:`PolicyProgram.candidate` first gives each value
        its parameter's form). The id of a program candidate with float scalars only and no artifacts is the same as
        in ratchet versions without array parameters, kinds or parameter types.

        Raises:
            PolicyError: an unknown kind, or an artifact digest that is not 64 hex characters.
        """
        if kind not in POLICY_KINDS:
            raise PolicyError(f"unknown policy kind {kind!r}; known: {', '.join(POLICY_KINDS)}")
        arts = dict(artifacts or {})
        for role, digest in arts.items():
            if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
                raise PolicyError(f"artifact {role!r}: {str(digest)[:80]!r} is not a SHA-256 hex digest")
        values = types.MappingProxyType({k: _value(v) for k, v in params.items()})
        return cls(_candidate_id(source, values, kind, arts), source, values, parent_id, refiner, kind,
                   types.MappingProxyType(dict(sorted(arts.items()))))

    @property
    def policy_key(self) -> str:
        """What a worker caches a loaded policy by: a digest of the kind, source and artifacts (not the
        parameter values, which travel with every episode)."""
        blob = json.dumps([self.kind, self.source, sorted(self.artifacts.items())])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (as stored in the ledger; array values as nested lists). ``kind`` and
        ``artifacts`` appear only for candidates other than plain programs (older ledgers read back)."""
        d = {"id": self.id, "source": self.source, "params": {k: _thaw(v) for k, v in self.params.items()},
             "parent_id": self.parent_id, "refiner": self.refiner}
        if self.kind != "program" or self.artifacts:
            d.update(kind=self.kind, artifacts=dict(self.artifacts))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        """Inverse of :meth:`to_dict`; the id is recomputed and must match.

        Raises:
            PolicyError: if the stored id does not match the content.
        """
        cand = cls.create(d["source"], d["params"], parent_id=d.get("parent_id"), refiner=d.get("refiner", "initial"),
                          kind=d.get("kind", "program"), artifacts=d.get("artifacts"))
        if "id" in d and d["id"] != cand.id:
            raise PolicyError(f"candidate id {d['id']} does not match its content ({cand.id}); the ledger is corrupt")
        return cand


#: The functions a policy for a Gymnasium task defines: ``act(observation, params)``.
ACT: Mapping[str, int] = {"act": 2}


def load_policy(path: str | Path, *, dims: Mapping[str, int] | None = None,
                functions: Mapping[str, int] | None = ACT) -> PolicyProgram:
    """Read and validate a policy file without executing it.

    Args:
        path: Path to a ``.py`` file defining ``PARAMETERS`` and ``act``.
        dims: The task's sizes ``{"obs": n, "act": m}`` (:func:`space_dims`), needed only when an
            array shape is written relative to the spaces, e.g. ``"shape": ["obs", "act"]``.
        functions: The functions the task calls, with their argument counts (``params`` last; the task's
            :attr:`~ratchet.tasks.Task.functions`); default ``act(observation, params)``; None checks none.

    Returns:
        The validated :class:`PolicyProgram`.

    Raises:
        PolicyError: file missing or unreadable, syntax error (with line number), no ``act``
            function, malformed ``PARAMETERS``, or a default outside its bounds.
    """
    p = Path(path)
    if p.is_dir():
        inside = " (e.g. " + str(p / "policy.py") + ")" if (p / "policy.py").is_file() else ""
        raise PolicyError(f"policy file not found: {p} is a folder; give the .py file defining PARAMETERS and "
                          f"act{inside}")
    if not p.is_file():
        raise PolicyError(f"policy file not found: {p} (give the path to a .py file defining PARAMETERS and act)")
    if p.suffix in (".toml", ".json", ".yaml", ".yml"):
        raise PolicyError(f"{p} is a {p.suffix[1:]} file, not a policy; give the .py file defining PARAMETERS and act "
                          "(a ratchet.toml goes to `ratchet run`)")
    try:
        source = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy file {p}: {exc}") from exc
    return parse_policy(source, str(p), dims=dims, functions=functions)


def _check_functions(funcs: Mapping[str, ast.FunctionDef], functions: Mapping[str, int], path: str) -> None:
    for name, arity in functions.items():
        args = ", ".join(["observation"] if name == "act" else [f"x{i + 1}" for i in range(arity - 1)]) + ", params"
        if name not in funcs:
            what = "that returns an action" if name == "act" else "(the task's evaluator calls it)"
            raise PolicyError(f"{path}: no top-level function {name}({args}); define one {what}")
        a = funcs[name].args
        positional = len(a.posonlyargs) + len(a.args)
        required = positional - len(a.defaults)
        if (positional < arity and a.vararg is None) or required > arity or any(d is None for d in a.kw_defaults):
            n = "two" if arity == 2 else str(arity)
            raise PolicyError(f"{path}:{funcs[name].lineno}: {name} must take {n} arguments ({args})")


def _find_parameters_node(tree: ast.Module) -> ast.expr | None:
    node = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PARAMETERS" for t in stmt.targets) or isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "PARAMETERS":
            node = stmt.value
    return node


def parse_policy(source: str, path: str = "<string>", *, dims: Mapping[str, int] | None = None,
                 functions: Mapping[str, int] | None = ACT) -> PolicyProgram:
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
    if functions is not None:
        _check_functions(funcs, functions, path)
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
    params = _validate_parameters(raw, path, node.lineno, dims)
    return PolicyProgram(source=source, parameters=params, path=path, has_reset="reset" in funcs)


def _finite(v: Any) -> bool:
    try:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
    except OverflowError:
        return False


def _nested_shape(v: Any) -> tuple[int, ...] | None:
    """Shape of a rectangular nested list/tuple of numbers (``()`` for a number), None if ragged."""
    if not isinstance(v, (list, tuple)):
        return ()
    if not v:
        return None
    inner = {_nested_shape(x) for x in v}
    if len(inner) != 1:
        return None
    shape = inner.pop()
    return None if shape is None else (len(v), *shape)


def _flat(v: Any) -> list[Any]:
    return [y for x in v for y in _flat(x)] if isinstance(v, (list, tuple)) else [v]


def _validate_shape(name: str, shape: Any, where: str, dims: Mapping[str, int] | None) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not shape or not all(
            (isinstance(d, int) and not isinstance(d, bool) and d >= 1) or d in TASK_DIMS for d in shape):
        raise PolicyError(f"{where}: parameter {name!r}: shape must be a list of positive integers (or \"obs\", "
                          f"\"act\") such as [8, 2], got {str(shape)[:40]} (leave shape out for a scalar)")
    if any(isinstance(d, str) for d in shape):
        if dims is None:
            raise PolicyError(f"{where}: parameter {name!r}: shape {list(shape)} refers to the task's spaces; give the "
                              "task's dims (ratchet run and evaluate do: load_policy(path, dims=space_dims(env)))")
        shape = [int(dims[d]) if isinstance(d, str) else d for d in shape]
    if math.prod(shape) > MAX_PARAMETER_NUMBERS:
        raise PolicyError(f"{where}: parameter {name!r}: shape {list(shape)} holds {math.prod(shape):,} numbers, "
                          f"more than the {MAX_PARAMETER_NUMBERS:,} ratchet allows; use a smaller shape")
    return tuple(shape)


def _array_field(name: str, key: str, v: Any, shape: tuple[int, ...], where: str) -> Any:
    """Check ``default``/``low``/``high`` of an array parameter: a number or a nested list of ``shape``."""
    got = _nested_shape(v)
    if got is None or got not in ((), shape):
        what = "a ragged list" if got is None else f"a list of shape {list(got)}"
        raise PolicyError(f"{where}: parameter {name!r}: {key} must be a number or a nested list of shape "
                          f"{list(shape)}, got {what}")
    for x in _flat(v):
        if not _finite(x):
            raise PolicyError(f"{where}: parameter {name!r}: every {key} must be a finite number, got {str(x)[:40]}")
    return float(v) if got == () else _freeze(v)


def _validate_parameters(raw: Any, path: str, lineno: int, dims: Mapping[str, int] | None = None) -> tuple[Parameter, ...]:
    where = f"{path}:{lineno}"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: PARAMETERS must be a dict name -> {{default, low, high}}, got {type(raw).__name__}")
    out = []
    total = 0
    for name, spec in raw.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise PolicyError(f"{where}: parameter name {name!r} must be an identifier string")
        if isinstance(spec, (tuple, list)) and len(spec) == 3:
            spec = {"default": spec[0], "low": spec[1], "high": spec[2]}
        if not isinstance(spec, dict):
            raise PolicyError(f"{where}: parameter {name!r} must be a dict with default, low, high (or a tuple (default, low, high))")
        unknown = set(spec) - _PARAM_KEYS
        if unknown:
            raise PolicyError(f"{where}: parameter {name!r} has unknown key(s) {sorted(map(str, unknown))}; "
                              "allowed: type, default, low, high, scale, shape, choices")
        kind = spec.get("type", "float")
        if not isinstance(kind, str) or kind not in PARAMETER_TYPES:
            raise PolicyError(f"{where}: parameter {name!r}: type must be \"float\", \"int\" or \"categorical\", "
                              f"got {_cut(repr(kind), 40)}")
        if kind == "categorical":
            param = _validate_categorical(name, spec, where)
        else:
            param = _validate_numeric(name, spec, kind, where, dims)
        total += param.size
        if total > MAX_PARAMETER_NUMBERS:
            raise PolicyError(f"{where}: PARAMETERS hold {total:,}+ numbers (at {name!r}), more than the "
                              f"{MAX_PARAMETER_NUMBERS:,} ratchet allows; use smaller shapes")
        out.append(param)
    return tuple(out)


def _validate_numeric(name: str, spec: dict[str, Any], kind: str, where: str,
                      dims: Mapping[str, int] | None) -> Parameter:
    """A float (scalar or array) or int parameter: default, low, high, and scale and shape where given."""
    if "choices" in spec:
        raise PolicyError(f"{where}: parameter {name!r}: choices belong to a categorical parameter (add "
                          f"\"type\": \"categorical\"); a{'n' if kind == 'int' else ''} {kind} parameter has "
                          "default, low and high")
    missing = {"default", "low", "high"} - set(spec)
    if missing:
        raise PolicyError(f"{where}: parameter {name!r} is missing {sorted(missing)}; give default, low and high")
    scale = spec.get("scale", "linear")
    if scale not in ("linear", "log"):
        raise PolicyError(f"{where}: parameter {name!r}: scale must be \"linear\" or \"log\", got {scale!r}")
    if kind == "int":
        return _validate_int(name, spec, scale, where)
    if "shape" in spec:
        return _validate_array(name, spec, _validate_shape(name, spec["shape"], where, dims), scale, where)
    return _validate_scalar(name, spec, scale, where)


def _validate_int(name: str, spec: dict[str, Any], scale: str, where: str) -> Parameter:
    if "shape" in spec:
        raise PolicyError(f"{where}: parameter {name!r}: an int parameter takes no shape; declare one int parameter "
                          "per number, or a float array parameter that act rounds")
    vals: dict[str, int] = {}
    for key in ("default", "low", "high"):
        v = spec[key]
        if isinstance(v, bool) or not isinstance(v, int):
            hint = (f"; write {int(v)}" if isinstance(v, float) and math.isfinite(v) and v.is_integer()
                    and abs(v) <= MAX_INT else "")
            raise PolicyError(f"{where}: parameter {name!r}: {key} of an int parameter must be an integer, "
                              f"got {_cut(repr(v), 40)}{hint}")
        if abs(v) > MAX_INT:
            raise PolicyError(f"{where}: parameter {name!r}: {key} {_cut(repr(v), 40)} is beyond ±2**53, where "
                              "integers stop being exact as floats; use narrower bounds")
        vals[key] = v
    if not vals["low"] < vals["high"]:
        raise PolicyError(f"{where}: parameter {name!r}: low ({vals['low']}) must be below high ({vals['high']})")
    if not vals["low"] <= vals["default"] <= vals["high"]:
        raise PolicyError(f"{where}: parameter {name!r}: default {vals['default']} is outside its bounds "
                          f"[{vals['low']}, {vals['high']}]; widen the bounds or change the default")
    if scale == "log" and vals["low"] < 1:
        raise PolicyError(f"{where}: parameter {name!r}: scale \"log\" on an int parameter needs low >= 1, "
                          f"got {vals['low']}")
    return Parameter(name, vals["default"], vals["low"], vals["high"], scale, (), "int")


def _validate_categorical(name: str, spec: dict[str, Any], where: str) -> Parameter:
    extra = sorted(set(spec) & {"low", "high", "scale", "shape"})
    if extra:
        raise PolicyError(f"{where}: parameter {name!r}: a categorical parameter has choices and a default, not "
                          f"{extra}")
    missing = {"choices", "default"} - set(spec)
    if missing:
        raise PolicyError(f"{where}: parameter {name!r} is missing {sorted(missing)}; give choices (a list) and a "
                          "default among them")
    choices = spec["choices"]
    if not isinstance(choices, (list, tuple)) or len(choices) < 2:
        raise PolicyError(f"{where}: parameter {name!r}: choices must be a list of two or more values, got "
                          f"{_cut(repr(choices), 40)}")
    for c in choices:
        if not (isinstance(c, (str, bool)) or _finite(c)):
            raise PolicyError(f"{where}: parameter {name!r}: every choice must be a string, a finite number or a "
                              f"boolean (JSON's literals), got {_cut(repr(c), 40)}")
    first: dict[Any, Any] = {}
    for c in choices:
        if c in first:  # 1, 1.0 and True are one key: Python compares them equal
            raise PolicyError(f"{where}: parameter {name!r}: choices {_cut(_literal(first[c]), 40)} and "
                              f"{_cut(_literal(c), 40)} are equal as Python compares them; keep one")
        first[c] = c
    param = Parameter(name, None, None, None, "linear", (), "categorical", tuple(choices))
    default = spec["default"]
    if not any(_same_literal(c, default) for c in choices):
        raise PolicyError(f"{where}: parameter {name!r}: default {_cut(repr(default), 40)} is not one of its "
                          f"choices {_cut(', '.join(_literal(c) for c in choices), 200)}")
    return dataclasses.replace(param, default=param.choices[param.index(default)])


def _validate_scalar(name: str, spec: dict[str, Any], scale: str, where: str) -> Parameter:
    vals = {}
    for key in ("default", "low", "high"):
        v = spec[key]
        if isinstance(v, (list, tuple)):
            raise PolicyError(f"{where}: parameter {name!r}: {key} is a list; add \"shape\": {list(_nested_shape(v) or [len(v)])}"
                              " to declare an array parameter")
        if not _finite(v):
            hint = "; write it without quotes" if isinstance(v, str) else ""
            raise PolicyError(f"{where}: parameter {name!r}: {key} must be a finite number, got {repr(v)[:40]}{hint}")
        vals[key] = float(v)
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
    return Parameter(name, vals["default"], vals["low"], vals["high"], scale)


def _validate_array(name: str, spec: dict[str, Any], shape: tuple[int, ...], scale: str, where: str) -> Parameter:
    import numpy as np

    vals = {key: _array_field(name, key, spec[key], shape, where) for key in ("default", "low", "high")}
    param = Parameter(name, vals["default"], vals["low"], vals["high"], scale, shape)
    default, low, high = param.array("default"), param.array("low"), param.array("high")

    def first(mask: Any) -> str:
        i = tuple(int(j) for j in np.argwhere(mask)[0])
        return f"at index {list(i)}"

    with np.errstate(over="ignore"):
        span = high - low
    if not np.all(np.isfinite(span)):
        raise PolicyError(f"{where}: parameter {name!r}: the range high - low overflows a float "
                          f"{first(~np.isfinite(span))}; use narrower bounds or scale \"log\"")
    if not np.all(low < high):
        i = first(~(low < high))
        raise PolicyError(f"{where}: parameter {name!r}: low must be below high elementwise, not so {i}")
    if not np.all((low <= default) & (default <= high)):
        i = first(~((low <= default) & (default <= high)))
        raise PolicyError(f"{where}: parameter {name!r}: default is outside its bounds {i}; widen the bounds or "
                          "change the default")
    if scale == "log" and not np.all(low > 0):
        raise PolicyError(f"{where}: parameter {name!r}: scale \"log\" needs low > 0 everywhere, not so {first(~(low > 0))}")
    return param


def _format_value(v: Any, indent: str) -> str:
    """Source text of a value: ``repr`` of each float (the shortest text that reads back exactly);
    a 1-D array on one line; a 2-D (or higher) array with one innermost row per line."""
    if not isinstance(v, (list, tuple)):
        return repr(float(v))
    if not any(isinstance(x, (list, tuple)) for x in v):
        return "[" + ", ".join(repr(float(x)) for x in v) + "]"
    inner = indent + "    "
    return "[\n" + "".join(f"{inner}{_format_value(x, inner)},\n" for x in v) + indent + "]"


def _within_bounds(param: Parameter, value: Any) -> Any:
    """``value`` with entries that miss ``param``'s bounds by rounding alone (a billionth of the range, as
    ``exp(log(high))`` does) set to the bound, so the value can be written back as a default; others as given."""
    import numpy as np

    v = np.asarray(value, dtype=np.float64)
    low, high = np.asarray(param.low, dtype=np.float64), np.asarray(param.high, dtype=np.float64)
    slack = 1e-9 * (high - low)
    out = np.where((v < low) & (v >= low - slack), low, np.where((v > high) & (v <= high + slack), high, v))
    if not np.array_equal(out, v):
        return float(out) if out.ndim == 0 else _value(out.tolist())
    return value


def source_lines(source: str) -> list[str]:
    """``source``'s lines as Python numbers them (ast's ``lineno``), line ends kept: split at ``\\n``, ``\\r\\n`` and
    ``\\r`` only, where ``str.splitlines`` also splits at a form feed, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029
    (which Python reads inside a line)."""
    return [line.decode("utf-8") for line in source.encode("utf-8").splitlines(keepends=True)]


def export_source(source: str, params: Mapping[str, Any], *, header: str | None = None) -> str:
    """Rewrite ``source`` so each parameter's ``default`` is the given value.

    Only the default literals change (plus an optional header comment), so the result diffs cleanly
    against the original file. An array parameter's default becomes a nested list with one row per
    line (:func:`_format_value`); an int parameter's an integer literal (``3``, never ``3.0``); a categorical
    one's the choice's literal as its ``choices`` write it (``"greedy"``, ``2``, ``True``); reading the file back
    gives exactly the same values.

    Raises:
        PolicyError: if ``source`` is not a valid policy, ``params`` names an unknown parameter, an
            array value does not have its parameter's shape, or a value is not of its parameter's type
            (:meth:`Parameter.coerce`).
    """
    import numpy as np

    program = parse_policy(source, dims=_infer_dims(source, params), functions=None)
    shapes = {p.name: p.shape for p in program.parameters}
    by_name = {p.name: p for p in program.parameters}
    tree = ast.parse(source)
    node = _find_parameters_node(tree)
    assert node is not None  # parse_policy checked
    lines = source_lines(source)
    edits: list[tuple[int, int, int, int, str]] = []  # (line, col, end_line, end_col, text)
    declared = set()
    if isinstance(node, ast.Dict):
        for key, val in zip(node.keys, node.values):
            assert key is not None  # parse_policy checked: a literal dict, no ** in it
            name = ast.literal_eval(key)
            declared.add(name)
            if name not in params:
                continue
            target, choices = None, None
            if isinstance(val, ast.Dict):
                for k2, v2 in zip(val.keys, val.values):
                    if k2 is not None and ast.literal_eval(k2) == "default":
                        target = v2
                    elif k2 is not None and ast.literal_eval(k2) == "choices":
                        choices = v2
            elif isinstance(val, (ast.Tuple, ast.List)):
                target = val.elts[0]
            if target is None or target.end_lineno is None or target.end_col_offset is None:
                raise PolicyError(f"cannot locate the default of parameter {name!r} to rewrite it")
            if shapes.get(name, ()):
                value = _value(params[name])
                got = _nested_shape(value)
                if got != shapes[name]:
                    raise PolicyError(f"export: parameter {name!r}: expected an array of shape {list(shapes[name])}, "
                                      f"got {'a number' if got == () else list(got or [])}")
                line = lines[target.lineno - 1]
                text = _format_value(_within_bounds(by_name[name], value), line[:len(line) - len(line.lstrip())])
            elif by_name[name].type == "float":
                text = repr(float(_within_bounds(by_name[name], params[name])))
            elif by_name[name].type == "int":
                text = _literal(by_name[name].coerce(params[name]))
            else:  # a choice as the file writes it in its choices (its quotes kept), else as repr writes it
                p = by_name[name]
                i = p.index(p.coerce(params[name]))
                segment = (ast.get_source_segment(source, choices.elts[i])
                           if isinstance(choices, (ast.List, ast.Tuple)) and len(choices.elts) == len(p.choices) else None)
                text = segment if segment is not None else _literal(p.choices[i])
            edits.append((target.lineno, target.col_offset, target.end_lineno, target.end_col_offset, text))
    unknown = set(params) - declared
    if unknown:
        raise PolicyError(f"export: unknown parameter(s) {sorted(unknown)} for this policy")
    blines = [ln.encode("utf-8") for ln in lines]
    starts = [0]
    for b in blines:
        starts.append(starts[-1] + len(b))
    data = b"".join(blines)
    for lineno, col, end_line, end, text in sorted(edits, reverse=True):
        data = data[:starts[lineno - 1] + col] + text.encode() + data[starts[end_line - 1] + end:]
    out = data.decode("utf-8")
    if header:
        out = "".join(f"# {h}\n" for h in header.splitlines()) + out
    reread = parse_policy(out, dims=_infer_dims(out, params), functions=None)
    written = {p.name: p.default_value for p in reread.parameters}
    for name, value in params.items():  # read back: each default is the value given (as bounded above)
        p = by_name[name]
        if p.type != "float":
            same = _same_literal(written.get(name), p.coerce(value))
        else:
            same = np.array_equal(np.asarray(written.get(name, np.nan), dtype=np.float64),
                                  np.asarray(_within_bounds(p, _value(value)), dtype=np.float64))
        if not same:
            raise PolicyError(f"export: parameter {name!r} did not read back as the value written; the policy's "
                              "PARAMETERS could not be rewritten in place (please report this file)")
    return out


#: The builtins as they were when this module was imported (in a worker: before any policy code ran).
_BUILTINS = dict(builtins.__dict__)


def compile_policy(source: str | types.CodeType, filename: str = "<policy>") -> types.ModuleType:
    """Execute policy source (or its compiled code object) in a fresh module. Only workers call this.

    The module resolves its bare names in a builtins namespace of its own, a copy of the builtins as they were
    before any policy code ran in the process: a name one instance writes there (``__builtins__["x"] = ...``, or
    ``builtins.x = ...``, which changes the process's ``builtins`` module) is seen by no other instance, so the
    episodes of a lockstep batch, each with an instance of its own, cannot reach each other through it.

    Raises:
        BaseException: whatever the policy's top-level code raises (SyntaxError for bad source; SystemExit too).
    """
    module = types.ModuleType("ratchet_policy")
    module.__file__ = filename
    module.__builtins__ = dict(_BUILTINS)  # type: ignore[attr-defined]
    code = source if isinstance(source, types.CodeType) else compile(source, filename, "exec")
    exec(code, module.__dict__)  # noqa: S102 - running policy code is the worker's job
    return module


def uses_global_random(code: types.CodeType) -> bool:
    """Whether compiled policy code may draw from the process-wide random generators (Python's ``random``,
    NumPy's ``np.random``): any name, attribute or text constant in it, or in the functions and classes it
    defines, that contains ``"random"``, or SciPy's ``rvs`` (a text constant counts when it could name a module:
    ``__import__("random")``). Conservative (``np.random.default_rng`` counts too): such a policy's
    episodes are run one at a time in a policy process, so each draws from generators seeded with its own seed
    alone, as :func:`ratchet.rollout.run_episode` seeds them."""
    stack = [code]
    while stack:
        c = stack.pop()
        if any("random" in n or n == "rvs" for n in c.co_names) or any("random" in n for n in c.co_varnames):
            return True  # rvs: SciPy's random variates, drawn from NumPy's global generator by default
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                stack.append(k)
            elif isinstance(k, str) and "random" in k and k.replace(".", "").isidentifier():  # not a docstring
                return True
    return False
