"""Evaluator tasks: a user's evaluator scores a policy's functions on problem instances.

The shape FunSearch, AlphaEvolve, OpenEvolve and generalized-planning work share: a *program* (here a ratchet
policy file) defines one or more functions, and a trusted *evaluator* builds problem instances and scores the
program on each by calling those functions. ``[task] kind = "evaluator"`` with ``evaluator = "evaluate.py"``
names the evaluator module, which is trusted like a Gymnasium environment:

.. code-block:: python

    FUNCTIONS = {"priority": "priority(item, bins, params) -> np.ndarray: one score per bin"}  # required
    DESCRIPTION = "Online bin packing ..."   # optional: the task in words (prompts, docs)
    COST_UNIT = "items"                        # optional: the unit of the cost evaluate() reports
    MAX_COST = 5000                            # required with COST_UNIT: the most one instance can cost
    SUCCESS = "the plan is valid"              # optional: instances succeed or fail, by this rule
    INSTANCES = 60                             # optional: a data set of 60 instances (seed = instance number)
    SPLITS = {"train": [...], ...}             # optional with INSTANCES: which instance is in which split

    OPTIONS                                    # set by ratchet before the module runs: [task] options (a dict)

    def make_instance(seed): ...               # instance ``seed``: generated from it, or read from a file
    def evaluate(instance, policy): ...        # the score (higher is better), or a dict (below)

``policy.priority(item, bins)`` calls the candidate's ``priority(item, bins, params)`` (ratchet appends the
parameters; the evaluator never sees them). The candidate runs in the sandbox; its answers cross the boundary
as numbers, text, numeric arrays, and tuples/lists/dicts of them (:func:`ratchet.execution.protocol.encode_value`),
never as pickles; text only where FUNCTIONS declares ``-> str`` (a compiled ``source`` policy answers with what it
printed, as text: read it with :func:`numbers`). A non-finite number, any other object, or an exception in the candidate fails that
instance for the candidate (the call raises; the evaluator should not catch it); check an answer with
:func:`as_array` before using it, so a ragged list or a wrong shape is the candidate's :class:`CandidateError`,
not the evaluator's exception. Arguments must be numbers, text, numeric arrays and tuples/lists/dicts of them.
A score that is not finite or beyond ±1e12 is the candidate's failure too. ``evaluate`` returns a float,
or a dict ``{"score", "success", "failure", "text", "diagnostics", "cost"}``: ``failure`` a short label of how
the instance failed (the critic groups failing instances by it), ``text`` the detail (≤ 500 characters:
where a plan broke), ``diagnostics`` named numbers, ``cost`` in ``COST_UNIT`` (default: every instance
costs 1, so the env-step budget counts instances). Raising :class:`CandidateError` fails the instance for the
candidate (an unusable answer: a wrong shape, an index out of range); any other exception (in ``make_instance`` or
``evaluate``) is the evaluator's fault: the run stops with one line naming the instance.

Time is charged to whoever uses it: the candidate's start (loading its module, its ``reset``) and its answers run
on its clock, the evaluator's own code on the evaluator's; each has ``[execution] episode_timeout_s`` per
instance. The candidate's running out fails the instance for it; the evaluator's is its fault (the run stops). So
is the evaluator's own process dying while its code runs (a segfault, ``os._exit``; under bubblewrap, where
policy code cannot reach that process), after the executor's retries; a death that may have come from outside
(SIGKILL) or happened while the candidate was asked is the candidate's failure.

The candidate learns about an instance only what the evaluator passes it: it is started with the same seed
(:data:`CANDIDATE_SEED`) on every instance, never the instance's, from which it could make the instance itself.

Seeds keep ratchet's three splits. A generated seed carries its split (``seed % 3``: 0 train, 1 validation,
2 test; :func:`split_of`), so an evaluator may, for instance, make held-out problems larger. With
``INSTANCES = n`` (at most :data:`MAX_INSTANCES`) the seeds are instance numbers ``0..n-1``, instance ``i`` in
split ``i % 3`` unless ``SPLITS`` says otherwise; each split draws only its own instances
(:meth:`EvaluatorTask.seed_pools`).

One fixed problem whose score depends on the candidate alone (``make_instance`` ignores the seed, as circle
packing's) is declared with ``[task] deterministic = true`` (:attr:`EvaluatorTask.deterministic`): each distinct
candidate is then scored once, and a promotion is a strict improvement confirmed by an exact re-evaluation
(:mod:`ratchet.deciders.exact`).

The evaluator's source is stored with the task (in the ledger), so a replay or a resume runs the same code;
a changed file starts a new run. Files the evaluator reads itself are the user's to keep unchanged.
"""

from __future__ import annotations

import ast
import hashlib
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

from ratchet.errors import TaskError

__all__ = ["CandidateError", "EvaluatorTask", "as_array", "numbers", "split_of"]

_SPLITS = ("train", "validation", "test")
MAX_TEXT = 500
MAX_LABEL = 80
MAX_SCORES = 32
MAX_SOURCE_BYTES = 1 << 20
#: The seed a candidate is started with on every instance (its ``reset(params, seed)`` and its random generators):
#: never the instance's, from which it could make the instance itself and look ahead; an instance reaches the
#: candidate only through the arguments the evaluator passes.
CANDIDATE_SEED = 0
#: Largest score magnitude an instance may have (a candidate's answer that overflows its evaluator's arithmetic
#: is that candidate's failure, not a number the statistics and plots must survive).
MAX_SCORE = 1e12


class CandidateError(Exception):
    """Raised by an evaluator when the candidate's answer is unusable (a wrong shape, an index out of range):
    that instance is the candidate's recorded failure, with this message as its reason."""


class _Fault(Exception):
    """The evaluator itself failed (raised, returned no score): the run stops, naming the instance."""


def as_array(value: Any, shape: tuple[int, ...] | None = None, name: str = "the answer",
             dtype: Any = np.float64) -> np.ndarray:
    """A candidate's answer as a finite numeric array (``dtype``) of ``shape`` (None: any), or
    :class:`CandidateError` saying what is wrong: the check an evaluator makes before it uses an answer, so a
    ragged list, a string or a wrong shape is the candidate's failure and never the evaluator's exception.

    Raises:
        CandidateError: not numeric, ragged, non-finite, or of another shape.
    """
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        raise CandidateError(f"{name} is not a numeric array (got {type(value).__name__})") from None
    if shape is not None and arr.shape != tuple(shape):
        raise CandidateError(f"{name} has shape {arr.shape}, expected {tuple(shape)}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise CandidateError(f"{name} has non-finite values")
    return arr


def numbers(text: Any, count: int | None = None, name: str = "the answer", dtype: Any = np.float64) -> np.ndarray:
    """A program's text answer (a ``source`` policy's stdout, :mod:`ratchet.policies.source`) as a 1-D array of
    ``dtype``: its whitespace-separated numbers, checked as :func:`as_array` checks an array, so text that does not
    parse is the candidate's :class:`CandidateError`, never the evaluator's exception.

    Args:
        text: The answer (``str``).
        count: How many numbers it must hold (None: any).
        name: What to call it in the message.
        dtype: ``np.float64``, or an integer type (each word must then be an integer).

    Raises:
        CandidateError: not text, a word that is not a number, the wrong count, or a non-finite value.
    """
    if not isinstance(text, str):
        raise CandidateError(f"{name} is not text (got {type(text).__name__})")
    words = text.split()
    if count is not None and len(words) != count:
        raise CandidateError(f"{name} has {len(words)} numbers, expected {count}")
    integer = np.issubdtype(np.dtype(dtype), np.integer)
    try:
        values = [int(w) if integer else float(w) for w in words]
        arr = np.asarray(values, dtype=dtype)
    except (ValueError, OverflowError):
        bad = next((w for w in words if not _parses(w, integer)), words[0] if words else "")
        raise CandidateError(f"{name}: {bad[:40]!r} is not {'an integer' if integer else 'a number'}") from None
    return as_array(arr, None, name, dtype)


def _parses(word: str, integer: bool) -> bool:
    try:
        int(word) if integer else float(word)
    except ValueError:
        return False
    return True


def split_of(seed: int) -> str:
    """The split a generated seed belongs to: ``"train"``, ``"validation"`` or ``"test"`` (``seed % 3``, as
    :class:`ratchet.planner.SeedSplits` makes them)."""
    return _SPLITS[int(seed) % 3]


@dataclass(frozen=True)
class _Declared:
    """What an evaluator module declares, checked (see the module docstring)."""

    functions: dict[str, int]
    signatures: dict[str, str]
    description: str | None
    cost_unit: str
    max_cost: int
    success: str | None
    pools: dict[str, tuple[int, ...]] | None
    returns: dict[str, str] = field(default_factory=dict)  # function -> the return type its signature declares


#: Return types a FUNCTIONS signature may declare after ``->`` that the candidate's answers are checked against
#: (:func:`_conforms`): an answer of another type is the candidate's failure, before the evaluator's code sees it
#: (an evaluator that runs ``float(answer)`` on a list would otherwise raise, and that is the task's fault). A type
#: not listed here is not checked.
RETURN_TYPES = {"float": "a number", "int": "an integer", "bool": "a bool", "str": "text",
                "np.ndarray": "an array or a list of numbers", "ndarray": "an array or a list of numbers",
                "numpy.ndarray": "an array or a list of numbers", "list": "a list", "tuple": "a tuple",
                "dict": "a dict"}


def _return_type(text: str) -> str | None:
    """The return type a signature declares (``"f(x, params) -> float: ..."`` gives ``"float"``), if it is one of
    :data:`RETURN_TYPES`; else None (not checked)."""
    import re

    m = re.match(r"[^>]*->\s*([A-Za-z_][\w.]*)\s*(?::|$)", text)
    return m.group(1) if m and m.group(1) in RETURN_TYPES else None


def _conforms(kind: str | None, value: Any) -> bool:
    """Whether an answer (already :func:`_checked`) is of the declared return type ``kind`` (None: anything)."""
    number = (int, float, np.integer, np.floating)
    if kind is None:
        return True
    if kind == "float":
        return (isinstance(value, number) and not isinstance(value, (bool, np.bool_))) or (
            isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf")
    if kind == "int":
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if kind == "bool":
        return isinstance(value, (bool, np.bool_))
    if kind == "str":
        return isinstance(value, str)
    if kind in ("np.ndarray", "ndarray", "numpy.ndarray"):
        return isinstance(value, (np.ndarray, list, tuple))
    return isinstance(value, {"list": list, "tuple": tuple, "dict": dict}[kind])


def _signature_arity(name: str, text: Any) -> int:
    if not isinstance(text, str) or not text.strip():
        raise TaskError(f"FUNCTIONS[{name!r}] must be text starting with its signature, e.g. "
                        f"\"{name}(x, params) -> float: ...\"")
    head = text.strip().split("->")[0].split(":")[0].strip()
    try:
        call = ast.parse(head, mode="eval").body
    except SyntaxError:
        call = None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.func.id != name \
            or not all(isinstance(a, ast.Name) for a in call.args) or call.keywords or not call.args:
        raise TaskError(f"FUNCTIONS[{name!r}] must start with the signature a policy writes, params last, e.g. "
                        f"\"{name}(x, params) -> float\"; got {text.strip()[:60]!r}")
    return len(call.args)


def _declared(module: types.ModuleType, where: str) -> _Declared:
    get = module.__dict__.get
    fns = get("FUNCTIONS")
    if not isinstance(fns, Mapping) or not fns:
        raise TaskError(f"{where}: define FUNCTIONS = {{\"name\": \"name(x, params) -> ...: what it returns\"}}, "
                        "the functions a policy must define")
    functions, signatures, returns = {}, {}, {}
    for name, text in fns.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or name in ("reset", "act"):
            raise TaskError(f"{where}: FUNCTIONS key {name!r} must be a public function name (not reset or act)")
        functions[name] = _signature_arity(name, text)
        signatures[name] = " ".join(str(text).split())
        kind = _return_type(signatures[name])
        if kind is not None:
            returns[name] = kind
    for fn in ("make_instance", "evaluate"):
        if not callable(get(fn)):
            raise TaskError(f"{where}: define {fn}() (see ratchet.tasks.evaluator)")
    unit, max_cost = get("COST_UNIT"), get("MAX_COST")
    if unit is None:
        if max_cost is not None:
            raise TaskError(f"{where}: MAX_COST needs COST_UNIT (the unit evaluate() reports its cost in)")
        unit, max_cost = "instances", 1
    elif not isinstance(unit, str) or not unit.strip() or len(unit) > 40:
        raise TaskError(f"{where}: COST_UNIT must be a short text such as \"items\"")
    elif isinstance(max_cost, bool) or not isinstance(max_cost, int) or not 1 <= max_cost <= 10**9:
        raise TaskError(f"{where}: COST_UNIT = {unit!r} needs MAX_COST, the most {unit} one instance can cost "
                        "(an int in 1..10**9), so the budget has a worst case")
    description, success = get("DESCRIPTION"), get("SUCCESS")
    for key, value in (("DESCRIPTION", description), ("SUCCESS", success)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise TaskError(f"{where}: {key} must be text")
    return _Declared(functions, signatures, description.strip() if description else None, unit, int(max_cost),
                     success.strip() if success else None, _pools(get("INSTANCES"), get("SPLITS"), where), returns)


#: Most instances a data set may declare (``INSTANCES``): every split's instance numbers are shuffled by the run
#: seed when a run starts (about 1.5 s per million on one core, in the driver and in each worker).
MAX_INSTANCES = 10**6


def _pools(count: Any, splits: Any, where: str) -> dict[str, tuple[int, ...]] | None:
    if count is None:
        if splits is not None:
            raise TaskError(f"{where}: SPLITS needs INSTANCES (how many instances the data set has)")
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 3:
        raise TaskError(f"{where}: INSTANCES must be the number of instances of the data set (an int ≥ 3)")
    if count > MAX_INSTANCES:
        raise TaskError(f"{where}: INSTANCES = {count:,}: at most {MAX_INSTANCES:,} (each run shuffles every "
                        "instance number); draw a sample of the data set in make_instance(seed) and leave out "
                        "INSTANCES, or declare a subset")
    if splits is None:
        return {s: tuple(range(code, count, 3)) for code, s in enumerate(_SPLITS)}
    if not isinstance(splits, Mapping) or set(splits) != set(_SPLITS):
        raise TaskError(f"{where}: SPLITS must map \"train\", \"validation\" and \"test\" to instance numbers")
    out: dict[str, tuple[int, ...]] = {}
    seen: set[int] = set()
    for s in _SPLITS:
        ids = splits[s]
        if not isinstance(ids, Sequence) or not ids or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in ids):
            raise TaskError(f"{where}: SPLITS[{s!r}] must be a non-empty list of instance numbers in 0..{count - 1}")
        if seen & set(ids) or len(set(ids)) != len(ids):
            raise TaskError(f"{where}: SPLITS share or repeat instances; a held-out instance must never be "
                            "used for selection")
        seen |= set(ids)
        out[s] = tuple(int(i) for i in ids)
    return out


def _load(source: str, path: str, options: Mapping[str, Any]) -> types.ModuleType:
    import json
    import sys

    name = "ratchet_evaluator_" + hashlib.sha256((source + json.dumps(options, sort_keys=True)).encode()).hexdigest()[:16]
    module = types.ModuleType(name)
    module.__file__ = path
    module.OPTIONS = dict(options)  # type: ignore[attr-defined]  # the module's settings, as env_kwargs are an env's
    sys.modules[name] = module  # dataclasses and pickling look their module up while it loads
    try:
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the evaluator is trusted, like an env
    except BaseException as exc:  # noqa: BLE001 - the user's module (even sys.exit at import): a setup problem, in one line
        sys.modules.pop(name, None)
        raise TaskError(f"{path}: the evaluator fails to load: {type(exc).__name__}: {_short(exc)}") from None
    return module


def _short(exc: BaseException, limit: int = 300) -> str:
    try:
        return " ".join(str(exc).split())[:limit]
    except Exception:  # noqa: BLE001 - an exception's __str__ may raise too
        return "<unprintable>"


_MODULES: dict[str, tuple[types.ModuleType, _Declared]] = {}


@dataclass(frozen=True)
class EvaluatorTask:
    """A task whose episodes are a trusted evaluator's scores of the policy's functions on problem instances.

    An episode: ``seed`` → ``make_instance(seed)`` → ``evaluate(instance, policy)``; its return is the score,
    its length the cost (``COST_UNIT``; 1 per instance by default), ``terminated`` True, ``truncated`` False.

    Args:
        path: The evaluator module's path (kept for messages and for ``__file__``).
        source: Its source text (stored with the task, so replay and resume run this exact code).
        success_threshold: An instance succeeds when its score is ``>=`` this (``[task] success_threshold``).
        label: What people and prompts call the task (``[task] name``); default the evaluator file's stem.
        options: Settings for the evaluator (``[task] options``, JSON values), its module global ``OPTIONS``
            before it runs: one evaluator file may serve several instance kinds or sizes.
        deterministic: ``[task] deterministic``: the score depends on the candidate alone, not on the instance's
            seed nor on when it runs (one fixed problem, as circle packing), so each distinct candidate is scored
            once (:attr:`ratchet.tasks.Task.deterministic`).

    Raises:
        TaskError: the module fails to load, or its declarations are malformed (one line saying which).
    """

    kind: ClassVar[str] = "evaluator"
    episode_unit: ClassVar[str] = "instances"
    return_name: ClassVar[str] = "score"
    batched_rollouts: ClassVar[bool] = False  # no run_batch: one instance at a time
    changes_on_promotion: ClassVar[bool] = False  # an evaluator does not change with the run
    records_transitions: ClassVar[bool] = False  # no environment: an instance is one call, nothing to step
    action_mode: ClassVar[str] = "error"

    path: str
    source: str
    success_threshold: float | None = None
    label: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    deterministic: bool = False
    _digest: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        import json

        if not isinstance(self.source, str):
            raise TaskError(f"{self.path}: the evaluator's source is not text")
        try:
            object.__setattr__(self, "options", json.loads(json.dumps(dict(self.options or {}))))
        except (TypeError, ValueError):
            raise TaskError("[task] options must hold JSON values (numbers, text, lists, tables)") from None
        object.__setattr__(self, "_digest", hashlib.sha256(self.source.encode()).hexdigest())
        self._module()

    def __hash__(self) -> int:
        return hash((self.path, self._digest))

    @classmethod
    def from_file(cls, path: str | Path, success_threshold: float | None = None, name: str | None = None,
                  options: Mapping[str, Any] | None = None, deterministic: bool = False) -> EvaluatorTask:
        """Read the evaluator at ``path``.

        Raises:
            TaskError: missing, unreadable, over 1 MiB, or as the constructor.
        """
        p = Path(path)
        if not p.is_file():
            raise TaskError(f"evaluator not found: {p} (set [task] evaluator to a .py file beside the spec)")
        try:
            data = p.read_bytes()
            if len(data) > MAX_SOURCE_BYTES:
                raise TaskError(f"{p}: {len(data):,} bytes; an evaluator module may have at most {MAX_SOURCE_BYTES:,}")
            source = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TaskError(f"cannot read evaluator {p}: {exc}") from None
        return cls(str(p.resolve()), source, success_threshold, name, dict(options or {}), deterministic)

    def _module(self) -> tuple[types.ModuleType, _Declared]:
        """The loaded module and its declarations (loaded once per process and source).

        Raises:
            TaskError: as the constructor; also ``[task] success_threshold`` given for an evaluator that declares
                its own ``SUCCESS`` (two rules for one thing).
        """
        import json

        key = self._digest + json.dumps(self.options, sort_keys=True)
        if key not in _MODULES:
            module = _load(self.source, self.path, self.options)
            _MODULES[key] = (module, _declared(module, Path(self.path).name))
        rule = _MODULES[key][1].success
        if self.success_threshold is not None and rule is not None:
            raise TaskError(f"[task] success_threshold = {self.success_threshold:g}, but {Path(self.path).name} declares "
                            f"SUCCESS ({rule[:60]!r}); keep one rule for success")
        return _MODULES[key]

    # -- the Task contract -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The ``[task] name``, else the evaluator file's stem (``"weibull"``)."""
        return self.label or Path(self.path).stem

    @property
    def functions(self) -> dict[str, int]:
        """The functions a policy must define, with how many arguments each takes (``params`` last)."""
        return dict(self._module()[1].functions)

    @property
    def step_limit(self) -> int:
        """The most cost one instance can have, in :attr:`cost_unit` (``MAX_COST``; 1 without a cost unit)."""
        return self._module()[1].max_cost

    @property
    def cost_unit(self) -> str:
        """What an episode's length counts: ``COST_UNIT``, or ``"instances"``."""
        return self._module()[1].cost_unit

    def seed_pools(self) -> dict[str, tuple[int, ...]] | None:
        """The instance numbers each split draws from (a data set), or None: any seed makes an instance."""
        pools = self._module()[1].pools
        return None if pools is None else dict(pools)

    def private_paths(self) -> tuple[str, ...]:
        """The evaluator's folder (its data sets, reference solutions): hidden from policy code under bubblewrap,
        unless it also holds the Python installation or the project (then left visible)."""
        return (str(Path(self.path).parent),)

    def rival_seeds(self) -> dict[str, list[int]]:
        """``{}``: an evaluator scores a policy alone."""
        return {}

    def after_promotion(self, incumbent: Any, payoffs: Mapping[str, Mapping[str, float]]) -> tuple[Self, dict[str, Any]]:
        """Itself, no notes: an evaluator does not change with the run."""
        return self, {}

    def opponent_sources(self) -> dict[str, str]:
        """``{}``: an evaluator scores one policy."""
        return {}

    def spaces(self) -> tuple[Any, Any]:
        """``(None, None)``: an evaluator task has no observation or action space."""
        return None, None

    def dims(self) -> dict[str, int]:
        """``{}``: no sizes for array shapes to name."""
        return {}

    def make_env(self, render_mode: str | None = None) -> Any:
        """Evaluator tasks have no environment.

        Raises:
            TaskError: always (a refiner that needs an environment does not apply to this task).
        """
        raise TaskError(f"{self.name} is an evaluator task: it has no environment to step (refiners and tools "
                        "that need one, such as ppo, dagger or traces, do not apply)")

    def is_success(self, episode_return: float, terminated: bool, truncated: bool) -> bool | None:
        """``score >= success_threshold`` when set; with ``SUCCESS`` declared, whether the instance finished
        (the evaluator's own verdict is applied by :meth:`run_episode`); else None."""
        if self.success_threshold is not None:
            return bool(episode_return >= self.success_threshold)
        if self._module()[1].success is not None:
            return bool(terminated)
        return None

    def success_rule(self) -> str | None:
        """How success is decided, or None."""
        if self.success_threshold is not None:
            return f"score ≥ {self.success_threshold:g} ([task] success_threshold)"
        rule = self._module()[1].success
        return None if rule is None else f"{rule} (the evaluator's SUCCESS)"

    @property
    def diagnose(self) -> Any:
        """Failing instances are grouped by the evaluator's ``failure`` label (errors by their text)."""
        return _diagnose

    def observation_names(self, size: int) -> list[str]:
        """No observations: generic names."""
        return [f"x[{i}]" for i in range(size)]

    def describe(self) -> str | None:
        """The evaluator's ``DESCRIPTION`` and the functions a policy defines, for prompts."""
        d = self._module()[1]
        lines = [d.description] if d.description else []
        lines += ["Functions the policy file defines (params is the dict of PARAMETERS values):",
                  *(f"- {sig}" for sig in d.signatures.values())]
        if d.cost_unit != "instances":
            lines.append(f"Each instance costs at most {d.max_cost:,} {d.cost_unit}.")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description, with the evaluator's source and its SHA-256 (and its cost unit and words for
        instances and scores, for displays of the recorded run)."""
        return {"kind": "evaluator", "evaluator": self.path, "source": self.source, "sha256": self._digest,
                "cost_unit": self.cost_unit, "episode_unit": self.episode_unit, "return_name": self.return_name,
                "success_threshold": self.success_threshold, **({"name": self.label} if self.label else {}),
                **({"options": dict(self.options)} if self.options else {}),
                **({"deterministic": True} if self.deterministic else {})}

    @classmethod
    def from_spec(cls, table: Any) -> EvaluatorTask:
        """From a spec's ``[task]`` table: ``evaluator`` is a path (resolved against the spec's folder by
        :func:`ratchet.spec.load_spec`); the ledger's stored form (with ``source``) is read as :meth:`from_dict`."""
        t = table if isinstance(table, Mapping) else table.model_dump()
        if t.get("source") is not None:
            return cls.from_dict(t)
        if not t.get("evaluator"):
            raise TaskError("[task] kind = \"evaluator\" needs evaluator = \"evaluate.py\" (the module that scores "
                            "a policy on problem instances)")
        return cls.from_file(t["evaluator"], t.get("success_threshold"), t.get("name"), t.get("options"),
                             bool(t.get("deterministic")))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvaluatorTask:
        """Inverse of :meth:`to_dict` (runs the stored source, never the file as it is now).

        Raises:
            TaskError: the stored source does not match its SHA-256.
        """
        task = cls(str(d["evaluator"]), d["source"], d.get("success_threshold"), d.get("name"), d.get("options") or {},
                   bool(d.get("deterministic")))
        if d.get("sha256") not in (None, task._digest):
            raise TaskError("the stored evaluator source does not match its SHA-256; the ledger is corrupt")
        return task

    # -- one episode -------------------------------------------------------------------------------------

    def run_episode(self, policy: Any, params: Mapping[str, Any], seed: int, render_path: str | None = None) -> Any:
        """Score the policy on instance ``seed`` (runs on the trusted side: the env host).

        Time is charged to whoever uses it (:meth:`PolicyHandle.task_clock`): the candidate's start (loading its
        module, its ``reset``) and its answers run on its clock, the evaluator's own code (``make_instance``,
        ``evaluate`` between calls) on the evaluator's; each has ``[execution] episode_timeout_s``.

        Args:
            policy: The candidate (:class:`ratchet.tasks.PolicyHandle`): started with ``params`` and the seed
                :data:`CANDIDATE_SEED` (never the instance's: an instance reaches the candidate only through the
                arguments the evaluator passes), then called through :meth:`PolicyHandle.call` for each function
                the evaluator calls.
            params: The candidate's parameter values (sent to the policy, never to the evaluator).
            seed: The instance's seed (or instance number of a data set).
            render_path: Ignored (nothing to render).

        Returns:
            The :class:`~ratchet.rollout.Episode`: the score as its return; the candidate's failures
            (it raised, hung, answered garbage or NaN, or the evaluator raised :class:`CandidateError`) as an
            errored episode; the evaluator's own failure as an errored episode with ``diagnostics["fault"] ==
            "task"`` (the loop stops the run on it).

        Raises:
            RolloutAborted: the policy process died, timed out or sent garbage (the executor's business); with
                ``fault`` set when the evaluator's own code ran out its clock.
        """
        import time

        from ratchet.rollout import Episode, PolicyFailure, RolloutAborted

        module, declared = self._module()
        proxy = _Proxy(policy, declared.functions, declared.returns)
        started = time.perf_counter()
        try:
            with policy.task_clock(f"evaluator {self.path} on instance {seed}"):
                try:
                    instance = module.make_instance(int(seed))
                except RolloutAborted:
                    raise  # the evaluator's clock ran out in make_instance: its fault (below), as in evaluate
                except BaseException as exc:  # noqa: BLE001 - the user's generator failing (even SystemExit): its fault
                    raise _Fault(f"make_instance raised {type(exc).__name__}: {_short(exc)}") from None
                proxy._start(dict(params))
                result = module.evaluate(instance, proxy)
                episode = self._episode(seed, result, declared, proxy.calls)
        except RolloutAborted as exc:
            if exc.fault:  # the evaluator's own clock ran out
                own = time.perf_counter() - started - proxy.waited_s
                exc.fault = (f"evaluator error on instance {seed}: the evaluator's own code ran {own:.1f} s, the time "
                             f"an instance may take (the candidate's start and answers {proxy.waited_s:.1f} s more, "
                             "on a clock of their own); make it faster or raise [execution] episode_timeout_s")
            raise
        except _Fault as exc:
            return Episode(seed, 0.0, 0, False, False, None, f"evaluator error on instance {seed}: {exc}"[:MAX_TEXT],
                           {"cause": "error", "fault": "task"})
        except (PolicyFailure, CandidateError, _BadAnswer) as exc:
            if isinstance(exc, PolicyFailure):
                text = f"{exc.kind}: {exc.text[:400]}" if exc.text else exc.kind
            else:
                text = _short(exc, 400)
            # without COST_UNIT every instance costs 1, one the candidate failed too (so the instances a run counts
            # and what its env-step budget counts agree); with one, what the failed instance cost is unknown: 0
            return Episode.failed(seed, text[:MAX_TEXT], 1 if declared.cost_unit == "instances" else 0, task=self)
        except BaseException as exc:  # noqa: BLE001 - the evaluator raised (even SystemExit): its fault, not the candidate's
            return Episode(seed, 0.0, 0, False, False, None,
                           f"evaluator error on instance {seed}: evaluate raised {type(exc).__name__}: "
                           f"{_short(exc)}"[:MAX_TEXT], {"cause": "error", "fault": "task"})
        return episode

    def _episode(self, seed: int, result: Any, declared: _Declared, calls: int) -> Any:
        from ratchet.rollout import Episode

        if isinstance(result, Mapping):
            unknown = set(result) - {"score", "success", "failure", "text", "diagnostics", "cost"}
            if unknown or "score" not in result:
                raise _Fault(f"evaluate returned a dict with {'unknown keys ' + str(sorted(map(str, unknown)))[:80] if unknown else 'no score'}")
            score = result["score"]
        else:
            score, result = result, {}
        if isinstance(score, (bool, np.bool_)) or not isinstance(score, (int, float, np.integer, np.floating)):
            raise _Fault(f"evaluate returned a score that is not a number ({type(score).__name__} {str(score)[:40]})")
        if not math.isfinite(float(score)) or abs(float(score)) > MAX_SCORE:
            raise _BadAnswer(f"the score {float(score):.3g} is not finite or beyond ±{MAX_SCORE:g} (an answer that "
                             "overflows the evaluator's arithmetic)")
        cost = result.get("cost", 1 if declared.cost_unit == "instances" else None)
        if cost is None:
            raise _Fault(f"evaluate reported no cost (COST_UNIT = {declared.cost_unit!r}: return {{'score': ..., 'cost': n}})")
        if isinstance(cost, (bool, np.bool_)) or not isinstance(cost, (int, np.integer)) or not 0 <= cost <= declared.max_cost:
            raise _Fault(f"evaluate reported cost {str(cost)[:40]}, not an int in 0..{declared.max_cost} (MAX_COST)")
        diagnostics: dict[str, Any] = {"cause": "terminated"}
        failure, text = result.get("failure"), result.get("text")
        if failure is not None:
            if not isinstance(failure, str) or not failure.strip():
                raise _Fault("evaluate returned a failure label that is not text")
            diagnostics["failure"] = " ".join(failure.split())[:MAX_LABEL]
        if text is not None:
            if not isinstance(text, str):
                raise _Fault("evaluate returned a text that is not text")
            diagnostics["text"] = text.strip()[:MAX_TEXT]
        named = result.get("diagnostics") or {}
        if not isinstance(named, Mapping) or len(named) > MAX_SCORES:
            raise _Fault(f"evaluate returned diagnostics that are not a dict of at most {MAX_SCORES} named numbers")
        scores = {}
        for k, v in named.items():
            if not isinstance(k, str) or isinstance(v, (bool, np.bool_)) or not isinstance(
                    v, (int, float, np.integer, np.floating)) or not math.isfinite(float(v)):
                raise _Fault(f"evaluate returned diagnostic {str(k)[:40]!r} = {str(v)[:40]}, not a finite number")
            scores[k[:40]] = float(v)
        if scores:
            diagnostics["scores"] = scores
        diagnostics["calls"] = calls
        success = result.get("success")
        if success is not None and not isinstance(success, (bool, np.bool_)):
            raise _Fault("evaluate returned a success that is not a bool")
        if self.success_threshold is not None:  # [task] success_threshold is the rule, whatever evaluate says
            success = float(score) >= self.success_threshold
        elif success is None and declared.success is not None:
            success = failure is None
        return Episode(int(seed), float(score), int(cost), True, False, None if success is None else bool(success),
                       None, diagnostics)


def _diagnose(episode: Any) -> list[str]:
    """Failure label of an evaluator episode: the evaluator's ``failure``, else the error's text."""
    label = episode.diagnostics.get("failure")
    if label:
        return [str(label)]
    if episode.error:
        from ratchet.critic import error_mode

        return [error_mode(episode.error)]
    return ["failed"]


class _BadAnswer(Exception):
    """The candidate answered something that is not a number, a numeric array, or a structure of them."""


class _Proxy:
    """The policy as an evaluator sees it: ``proxy.name(*args)`` calls the candidate's ``name(*args, params)``
    (in the sandbox) and returns its checked answer."""

    def __init__(self, policy: Any, functions: Mapping[str, int], returns: Mapping[str, str] | None = None) -> None:
        self._policy, self._functions, self.calls = policy, dict(functions), 0
        self._returns = dict(returns or {})  # the return types FUNCTIONS declares (RETURN_TYPES), checked
        self.waited_s = 0.0  # seconds spent waiting for the candidate: its start and its answers

    def _start(self, params: dict[str, Any]) -> None:
        """Start the candidate for an instance: with :data:`CANDIDATE_SEED`, the same for every instance."""
        import time

        t0 = time.perf_counter()
        try:
            self._policy.start(params, CANDIDATE_SEED, (None, None))
        finally:
            self.waited_s += time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._functions:
            raise AttributeError(f"the policy has no function {name!r} for the evaluator; FUNCTIONS declares "
                                 f"{', '.join(self._functions)}")
        arity = self._functions[name] - 1

        def call(*args: Any) -> Any:
            if len(args) != arity:
                raise TypeError(f"{name}() takes {arity} argument(s) besides params (FUNCTIONS), got {len(args)}")
            bad = _not_plain(args)
            if bad is not None:
                raise TypeError(f"{name}() was passed {bad}; arguments must be numbers, text, numpy arrays and "
                                "tuples/lists/dicts of them (the sandbox unpickles nothing else)")
            import time

            self.calls += 1
            t0 = time.perf_counter()
            try:
                answer = self._policy.call(name, args)
            finally:
                self.waited_s += time.perf_counter() - t0
            kind = self._returns.get(name)
            answer = _checked(name, answer, text=kind == "str")
            if not _conforms(kind, answer):
                raise _BadAnswer(f"{name}() returned a {type(answer).__name__}; FUNCTIONS declares -> {kind} "
                                 f"({RETURN_TYPES[str(kind)]})")
            return answer

        return call


_PLAIN = (int, float, bool, str, bytes, type(None), np.integer, np.floating, np.bool_)


def _not_plain(value: Any, depth: int = 0) -> str | None:
    """What in an argument is not plain data (numbers, text, numeric/bool arrays, tuples/lists/dicts), or None."""
    if type(value) in _PLAIN or isinstance(value, (np.integer, np.floating, np.bool_)):
        return None
    if type(value) is np.ndarray:
        return None if value.dtype.kind in "biuf" else f"an array of dtype {value.dtype}"
    if type(value) in (tuple, list) and depth < 8:
        return next((b for b in (_not_plain(v, depth + 1) for v in value) if b is not None), None)
    if type(value) is dict and depth < 8:
        return next((b for b in (_not_plain(v, depth + 1) for v in (*value.keys(), *value.values())) if b is not None),
                    None)
    return f"a {type(value).__name__}"


def _checked(name: str, value: Any, depth: int = 0, text: bool = False) -> Any:
    """The candidate's answer with every number finite, or :class:`_BadAnswer` saying what is wrong. Text is an
    answer only where FUNCTIONS declares ``-> str`` (``text``), and only as the whole answer: an evaluator that
    expects numbers never meets a string."""
    from ratchet.rollout import Opaque

    if isinstance(value, str):
        if text and depth == 0:
            return value
        raise _BadAnswer(f"{name}() returned str {value[:40]!r}; expected numbers or numeric arrays")
    if isinstance(value, Opaque):
        raise _BadAnswer(f"{name}() returned {value.type_name} {value.text}; expected numbers or numeric arrays")
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise _BadAnswer(f"{name}() returned an array with non-finite values")
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise _BadAnswer(f"{name}() returned {value}")
    if isinstance(value, (tuple, list)):
        return type(value)(_checked(name, v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: _checked(name, v, depth + 1) for k, v in value.items()}
    return value
