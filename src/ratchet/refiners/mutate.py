"""Program-mutation refiner (``kind = "mutate"``): genetic programming over the policy's code, no LLM.

Each generation the refiner rewrites the parent's source a few times with one structural mutation
each, checks every new program before any episode runs (:func:`ratchet.refiners.structural.check_source`;
a mutant that fails is a recorded failed proposal), and proposes each surviving program with a few
sets of parameter values. Mutations act on the syntax tree of the policy's functions (``act`` and its
helpers) and are spliced back into the source text, so comments and layout elsewhere survive and the
promotion's diff is readable:

- ``constant``: a numeric constant becomes a new tunable parameter (default: the constant; bounds:
  same sign, up to twice its size; ``[-1, 1]`` for zero); not an action returned as is, nor, for a
  Discrete action space, one returned by a conditional expression (``return 2 if ... else 0``);
- ``term``: an arithmetic expression ``e`` becomes ``(e + p * observation[i])`` with a new parameter
  ``p`` in ``[-b, b]`` (default 0), ``b`` = ``term_bound`` over element ``i``'s scale (half the width of
  the range it was seen to take, see below; ``term_bound`` before any is seen:
  :meth:`_Space.weight_bound`), so a weight can make an element matter whatever its units;
- ``guard``: a guarded rule ``if observation[i] > p: return a`` (or ``<``) at the top of ``act``, with a
  new threshold ``p`` where element ``i`` lives — the range it was seen to take, widened by half its
  width each side, within the observation's bounds (the observation's bounds before any episode is seen:
  :meth:`_Space.threshold_bounds`), since a threshold outside the values an element takes never changes
  what the program does — and ``a`` a discrete action or, for a Box action, new parameters in the
  action's bounds;

  the range an element was seen to take is that of the final observations of the incumbent's episodes
  cut by the time limit so far (:meth:`_Space.see`: states they were passing through, not the edge where
  a terminated episode failed or succeeded);

  both guided by the critique and by what the program reads: the element ``i`` is drawn with half its
  probability on the features the parent's failure modes are described by (failing episodes end with them
  unusually high or low; :func:`feature_focus`), and a guard on such a feature points that way; where
  ``act`` never reads some elements (:func:`unread_elements`), half of the probability goes to those —
  information a program ignores is the structure it most plainly lacks;
- ``swap``: a comparison flipped (``>`` ↔ ``<``), or the branches of an ``if``/``else`` swapped;
- ``delete``: one statement deleted (``pass`` where it was the only one of its block); never one whose deletion
  leaves a name assigned in only one branch of an ``if`` and read after it (UnboundLocalError whenever the other
  branch runs, which the checks do not refuse: :func:`ratchet.proposals.one_branch_reads`);
- ``crossover``: one function replaced by its version in a second program drawn from the archive,
  with the parameters and helper functions it needs.

A ``source`` policy (a folder of files in any language, :mod:`ratchet.policies.source`) is mutated through its
numbers only: the literals of its marked regions, tuned around a parent's values or one of them drawn anew
(:meth:`MutationRefiner._mutate_numbers`); its code itself is left to ``llm``.

Parents come from an archive, not only the incumbent (:mod:`ratchet.refiners.archive`: MAP-Elites
cells by behaviour, FunSearch's softmax draw). Each program starts from the incumbent with probability
``incumbent_share``, else from an elite of the archive; an elite drawn is, with probability
``tune_share``, proposed again with its parameters perturbed around its values (``tune``) instead of
mutated, so a good mutant's numbers keep being tuned over generations before it wins a gate. Every
evaluated proposal is offered to the archive, scored as the incumbent's running training mean plus its
paired difference to the incumbent on the same training seeds. Operators are drawn with probability
proportional to their record of beating the incumbent ((1 + wins) / (2 + tries)): adaptive operator
selection, so operators that never help on a task fade without vanishing. The gated incumbent stays
the run's one result: the gate always compares a contender with it.

The parent's tuned values are written into its source as the defaults before it is mutated
(:func:`~ratchet.refiners.structural.baked_source`), so a mutant starts from the parent's numbers.
A mutation that gives a program proposed before (a small program has few distinct rewrites) proposes it
again with new draws of its numbers, not its defaults again: a few settings do not exhaust a rewrite, and
on a flat landscape, where every candidate ties with the incumbent, those draws are what finds the step up.

Tuning the new numbers. A mutation that adds a parameter usually adds it at a neutral value (a zero
weight, a guard that never fires): proposed only at its defaults, a mutant behaves like its parent and
can never pass the gate. So each mutant is proposed with ``variants`` parameter settings
(:func:`~ratchet.refiners.structural.param_variants`) where the new parameters are drawn across their
bounds and the others perturbed around the parent's values (the defaults themselves are tried only
where the mutation changes behaviour at its defaults: ``swap``, ``delete``, ``crossover``). All of them
run on the generation's training seeds, the best goes to the gate, and once a mutant is promoted every
``cmaes`` refiner of the run restarts on the new program's ``PARAMETERS``
(:class:`~ratchet.refiners.cmaes.CMAESRefiner` follows structural promotions). This keeps structure
and numbers with the tool suited to each without a planner that hands non-incumbents to CMA-ES: the
gate only ever compares the incumbent with a contender, and CMA-ES only ever searches around the
incumbent.

Every random choice comes from the ``rng`` passed to :meth:`MutationRefiner.propose`, so a run (and
its resume) proposes the same mutants.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator

from ratchet.critic import Critique, Evaluation
from ratchet.errors import PolicyError
from ratchet.policy import FOLDER_KINDS, Candidate, PolicyProgram, source_lines
from ratchet.proposals import one_branch_reads
from ratchet.refiners.archive import ArchiveSettings, draw_parent, offer_generation
from ratchet.refiners.base import GenerationCost, Refiner
from ratchet.refiners.structural import (
    Rejection,
    add_parameters,
    baked_source,
    bounds_around,
    check_source,
    digest,
    fresh_name,
    param_variants,
    splice,
)

__all__ = ["OPERATORS", "MutateSettings", "MutationRefiner", "mutate_source"]

#: The mutation operators, in the order ``operators`` defaults to.
Operator = Literal["constant", "term", "guard", "swap", "delete", "crossover"]

OPERATORS: tuple[Operator, ...] = ("constant", "term", "guard", "swap", "delete", "crossover")


class MutateSettings(ArchiveSettings):
    """Settings of a ``mutate`` refiner (a ``[[refiners]]`` table with ``kind = "mutate"``)."""

    model_config = ConfigDict(extra="forbid")

    programs: int = Field(3, ge=1, le=100, description="Mutated programs proposed per generation.",
                          json_schema_extra={"unit": "programs"})
    variants: int = Field(3, ge=1, le=50, description="Parameter settings each mutated program is proposed with "
                                                      "(its defaults, then new parameters drawn across their bounds "
                                                      "and the others perturbed).",
                          json_schema_extra={"unit": "candidates"})
    operators: list[Operator] = Field(default_factory=lambda: list(OPERATORS),
                                      description="Mutation operators to draw from, uniformly.")
    term_bound: float = Field(1.0, gt=0, le=1e6, description="Bounds ±term_bound of a weight added by `term`, over "
                                                             "half the width of the range its observation element "
                                                             "was seen to take (as is before any was seen).")
    feature_bound: float = Field(3.0, gt=0, le=1e6, description="Threshold bounds ±feature_bound of a `guard` on an "
                                                                "observation element whose space is unbounded, "
                                                                "before the range it takes was seen.")
    sigma: float = Field(0.15, gt=0, le=1, description="Perturbation of the other parameters in the variants "
                                                       "(fraction of each parameter's range).")
    tune_share: float = Field(0.5, ge=0, le=1, description="Share of the programs drawn from the archive that are "
                                                          "proposed again with perturbed parameters instead of "
                                                          "mutated.")

    @field_validator("operators")
    @classmethod
    def _some(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"give one or more distinct operators of {', '.join(OPERATORS)}")
        return v


class _Space:
    """What mutations need to know of the task's spaces (made once, in the driver; no policy code runs).

    ``focus`` (set per generation from the critique, see :func:`feature_focus`) weights which observation
    element ``term`` and ``guard`` use, and ``direction`` which way a guard on it points. ``seen_low`` and
    ``seen_high`` (float64, shape ``(obs_dim,)``, observation units; None until an episode is seen) are the
    range each element took in the final observations of the truncated episodes observed so far
    (:meth:`see`): a guard's threshold is drawn there."""

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        from gymnasium import spaces

        self.focus: np.ndarray | None = None
        self.direction: dict[int, bool] = {}
        self.seen_low: np.ndarray | None = None
        self.seen_high: np.ndarray | None = None

        o, a = observation_space, action_space
        self.obs_dim = int(o.shape[0]) if isinstance(o, spaces.Box) and len(o.shape) == 1 else 0
        self.obs_low = np.asarray(o.low, dtype=np.float64) if self.obs_dim else np.zeros(0)
        self.obs_high = np.asarray(o.high, dtype=np.float64) if self.obs_dim else np.zeros(0)
        self.discrete = (int(a.start), int(a.n)) if isinstance(a, spaces.Discrete) else None
        self.box = ((np.asarray(a.low, dtype=np.float64), np.asarray(a.high, dtype=np.float64))
                    if isinstance(a, spaces.Box) and len(a.shape) == 1 and a.shape[0] <= 8 else None)

    def see(self, evaluations: Sequence[Evaluation]) -> None:
        """Widen ``seen_low``/``seen_high`` by the final observations (``diagnostics["final_observation"]``)
        of the episodes the time limit cut (:attr:`~ratchet.rollout.Episode.timed_out`): such an episode ends in a
        state it was passing through, while one that terminated (or errored) ends where it failed or succeeded, at
        the edge of what it visited. Entries of another length or non-finite ones are skipped."""
        rows = [ep.diagnostics.get("final_observation") for ev in evaluations for ep in ev.episodes if ep.timed_out]
        vals = [np.asarray(r, dtype=np.float64) for r in rows if isinstance(r, (list, tuple)) and len(r) == self.obs_dim]
        vals = [v for v in vals if np.all(np.isfinite(v))]
        if not self.obs_dim or not vals:
            return
        x = np.stack(vals)
        lo, hi = x.min(axis=0), x.max(axis=0)
        self.seen_low = lo if self.seen_low is None else np.minimum(self.seen_low, lo)
        self.seen_high = hi if self.seen_high is None else np.maximum(self.seen_high, hi)

    def weight_bound(self, i: int, term_bound: float) -> float:
        """Bound ``b`` of a new weight ``p`` in ``[-b, b]`` on element ``i``: ``term_bound`` over the element's
        scale (half the width of the range it was seen to take, :meth:`see`), two significant digits, so
        ``p * observation[i]`` can move an expression by up to about ``term_bound`` whatever the element's
        units: a velocity of ±0.07 gets weights up to ~±15, an angle of ±3 up to ~±0.3. ``term_bound`` itself
        before any episode was seen or where the element never varied."""
        if self.seen_low is None or self.seen_high is None:
            return term_bound
        half = (float(self.seen_high[i]) - float(self.seen_low[i])) / 2
        if not half > 0:
            return term_bound
        b = term_bound / half
        return float(f"{b:.2g}")

    def threshold_bounds(self, i: int, feature_bound: float) -> tuple[float, float]:
        """Bounds of a new threshold on element ``i``: the range it was seen to take (:meth:`see`), widened by
        half its width on each side and kept within the observation's bounds; the observation's bounds
        (``±feature_bound`` where they are infinite or wider than 2,000) before any episode was seen or where
        the element never varied. A threshold outside the values an element takes never changes what the
        program does, so drawing it where the element lives is what makes a new guard matter."""
        lo, hi = float(self.obs_low[i]), float(self.obs_high[i])
        if not (np.isfinite(lo) and np.isfinite(hi)) or hi - lo > 2e3:
            lo, hi = -feature_bound, feature_bound
        if self.seen_low is None or self.seen_high is None:
            return lo, hi
        a, b = float(self.seen_low[i]), float(self.seen_high[i])
        if not b > a:
            return lo, hi
        margin = (b - a) / 2
        step = 10.0 ** (math.floor(math.log10(b - a)) - 1)  # rounded outwards to two significant digits of the width
        digits = max(0, -math.floor(math.log10(step)))
        a = max(lo, round(math.floor((a - margin) / step) * step, digits))
        b = min(hi, round(math.ceil((b + margin) / step) * step, digits))
        return (a, b) if b > a else (lo, hi)


def feature_focus(critique: Critique | None, names: Sequence[str]) -> tuple[np.ndarray | None, dict[int, bool]]:
    """Which observation elements the critique blames: the features its failure modes are described by
    (``"pole_angle high (+1.8σ)"``: failing episodes end with that element far from the others), weighted
    by each mode's share of episodes. Half of the probability goes to them, half stays uniform, so every
    element remains possible.

    Returns:
        ``(probabilities over elements or None when the critique names none, {element: True for "high"})``.
    """
    if critique is None or not names:
        return None, {}
    w = np.zeros(len(names))
    direction: dict[int, bool] = {}
    for mode in critique.failure_modes:
        for i, name in enumerate(names):
            for side in ("high", "low"):
                if f"{name} {side} (" in mode.description:
                    w[i] += mode.share
                    direction.setdefault(i, side == "high")
    if not w.sum():
        return None, {}
    return 0.5 / len(names) + 0.5 * w / w.sum(), direction


def _feature(rng: np.random.Generator, space: _Space, unread: Sequence[int] = ()) -> int:
    """An observation element for ``term`` or ``guard``: uniform, or :func:`feature_focus`'s weights; where the
    program never reads some elements (``unread``, see :func:`unread_elements`), half of the probability goes
    to them: the information a program ignores is the structure it most plainly lacks."""
    p = space.focus if space.focus is not None and len(space.focus) == space.obs_dim else None
    if unread:
        u = np.zeros(space.obs_dim)
        u[list(unread)] = 1.0 / len(unread)
        p = 0.5 * (np.full(space.obs_dim, 1.0 / space.obs_dim) if p is None else p) + 0.5 * u
    if p is not None:
        return int(rng.choice(space.obs_dim, p=p))
    return int(rng.integers(space.obs_dim))


def unread_elements(tree: ast.Module, obs_dim: int) -> list[int]:
    """Observation elements that ``act`` never reads, ascending.

    An element is read where ``act`` indexes its observation argument with a constant (``observation[1]``,
    ``observation[-1]``). Where ``act`` uses the observation any other way (passes it on, slices it, unpacks it,
    indexes it with a variable), every element may be read and none is returned.
    """
    act = _act(tree)
    obs = _obs_name(act)
    if obs is None or not obs_dim:
        return []
    parents = _parents(act)
    read: set[int] = set()
    for node in ast.walk(act):
        if not (isinstance(node, ast.Name) and node.id == obs):
            continue
        up = parents.get(id(node))
        index = up.slice if isinstance(up, ast.Subscript) and up.value is node else None
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and isinstance(index.operand, ast.Constant):
            index = ast.Constant(-index.operand.value) if isinstance(index.operand.value, int) else None
        if not (isinstance(index, ast.Constant) and isinstance(index.value, int) and not isinstance(index.value, bool)
                and -obs_dim <= index.value < obs_dim):
            return []
        read.add(index.value % obs_dim)
    return [i for i in range(obs_dim) if i not in read]


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """Top-level functions a mutation may touch: ``act`` first, then helpers (not ``reset``)."""
    fns = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name != "reset"]
    return sorted(fns, key=lambda f: f.name != "act")


def _act(tree: ast.Module) -> ast.FunctionDef:
    return next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "act")


def _parents(fn: ast.AST) -> dict[int, ast.AST]:
    out: dict[int, ast.AST] = {}
    for node in ast.walk(fn):
        for child in ast.iter_child_nodes(node):
            out[id(child)] = node
    return out


def _in_index(node: ast.AST, parents: Mapping[int, ast.AST]) -> bool:
    """Whether ``node`` sits in a subscript's index, a default argument, or an annotation."""
    cur = node
    while id(cur) in parents:
        up = parents[id(cur)]
        if isinstance(up, ast.Subscript) and cur is up.slice:
            return True
        if isinstance(up, ast.arguments) or (isinstance(up, ast.arg) and cur is up.annotation):
            return True
        if isinstance(up, ast.FunctionDef) and cur is up.returns:
            return True
        cur = up
    return False


def _returned(node: ast.AST, parents: Mapping[int, ast.AST]) -> bool:
    """Whether ``node`` is what a ``return`` returns, directly or as a branch of conditional expressions."""
    cur = node
    up = parents.get(id(cur))
    while isinstance(up, ast.IfExp) and cur is not up.test:
        cur, up = up, parents.get(id(up))
    return isinstance(up, ast.Return)


def _span(node: ast.expr | ast.stmt) -> tuple[tuple[int, int], tuple[int, int]]:
    assert node.end_lineno is not None and node.end_col_offset is not None  # ast.parse sets positions
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)


def _body_statements(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The function's body without its docstring."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
            body[0].value.value, str):
        return body[1:]
    return list(body)


def _declared(source: str) -> set[str]:
    from ratchet.policy import _raw_parameters

    return set(_raw_parameters(source))


# -- operators: each returns (new source, names of parameters it introduced) or None when it does not apply --

def _op_constant(source: str, tree: ast.Module, rng: np.random.Generator, space: _Space,
                 s: MutateSettings) -> tuple[str, list[str]] | None:
    sites = []
    for fn in _functions(tree):
        parents = _parents(fn)
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
                    and not isinstance(node.value, bool)) or _in_index(node, parents):
                continue
            target: ast.expr = node
            value = float(node.value)
            up = parents.get(id(node))
            if isinstance(up, ast.UnaryOp) and isinstance(up.op, ast.USub):
                target, value, up = up, -value, parents.get(id(up))
            if isinstance(up, ast.Return) or (isinstance(up, ast.Compare) and any(
                    isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)) for op in up.ops)):
                continue  # an action returned as is, or a discrete comparison: not a tunable number
            if space.discrete is not None and _returned(target, parents):
                continue  # a discrete action, returned by a conditional expression: a label, not a number
            if isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id in ("range", "int", "round"):
                continue
            sites.append((target, value))
    if not sites:
        return None
    target, value = sites[int(rng.integers(len(sites)))]
    name = fresh_name("k", _declared(source))
    lo, hi = bounds_around(value)
    return add_parameters(source, {name: (value, lo, hi)}, [(*_span(target), f'params["{name}"]')]), []


def _obs_name(fn: ast.FunctionDef) -> str | None:
    args = fn.args.posonlyargs + fn.args.args
    return args[0].arg if args else None


def _op_term(source: str, tree: ast.Module, rng: np.random.Generator, space: _Space,
             s: MutateSettings) -> tuple[str, list[str]] | None:
    if not space.obs_dim:
        return None
    act = _act(tree)
    obs = _obs_name(act)
    parents = _parents(act)
    sites: list[ast.expr] = []
    for node in ast.walk(act):
        if _in_index(node, parents):
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            sites.append(node)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
                node.ops[0], (ast.Gt, ast.Lt, ast.GtE, ast.LtE)) and not isinstance(node.left, ast.Constant):
            sites.append(node.left)
    if not sites or obs is None:
        return None
    node = sites[int(rng.integers(len(sites)))]
    i = _feature(rng, space, unread_elements(tree, space.obs_dim))
    name = fresh_name("w", _declared(source))
    text = ast.get_source_segment(source, node)
    if text is None:
        return None
    new = f'({text} + params["{name}"] * {obs}[{i}])'
    b = space.weight_bound(i, s.term_bound)
    return add_parameters(source, {name: (0.0, -b, b)}, [(*_span(node), new)]), [name]


def _op_guard(source: str, tree: ast.Module, rng: np.random.Generator, space: _Space,
              s: MutateSettings) -> tuple[str, list[str]] | None:
    if not space.obs_dim:  # no observation to guard on (an evaluator task)
        return None
    act = _act(tree)
    obs = _obs_name(act)
    body = _body_statements(act)
    if obs is None or not body or (space.discrete is None and space.box is None):
        return None
    i = _feature(rng, space, unread_elements(tree, space.obs_dim))
    lo, hi = space.threshold_bounds(i, s.feature_bound)
    greater = bool(rng.integers(2))
    greater = space.direction.get(i, greater)  # toward where the failing episodes end
    taken = _declared(source)
    g = fresh_name("g", taken)
    entries: dict[str, tuple[float, float, float]] = {g: (hi if greater else lo, lo, hi)}  # neutral: never fires
    if space.discrete is not None:
        start, n = space.discrete
        action = str(start + int(rng.integers(n)))
    else:
        assert space.box is not None  # checked above: Discrete or Box actions
        alo, ahi = space.box
        names = []
        for j in range(len(alo)):
            a = f"{g}_a{j}" if f"{g}_a{j}" not in taken else fresh_name(f"{g}_a{j}", taken | set(entries))
            l, h = (float(alo[j]), float(ahi[j])) if np.isfinite(alo[j]) and np.isfinite(ahi[j]) else (-1.0, 1.0)
            entries[a] = ((l + h) / 2, l, h)
            names.append(f'params["{a}"]')
        action = "[" + ", ".join(names) + "]"
    first = body[0]
    indent = " " * first.col_offset
    rule = (f'if {obs}[{i}] {">" if greater else "<"} params["{g}"]:\n{indent}    return {action}\n{indent}')
    pos = (first.lineno, first.col_offset)
    return add_parameters(source, entries, [(pos, pos, rule)]), list(entries)


_FLIP = {ast.Gt: "<", ast.Lt: ">", ast.GtE: "<=", ast.LtE: ">="}


def _op_swap(source: str, tree: ast.Module, rng: np.random.Generator, space: _Space,
             s: MutateSettings) -> tuple[str, list[str]] | None:
    sites: list[tuple[str, Any]] = []  # ("compare", ast.Compare), ("if", ast.If) or ("ifexp", ast.IfExp)
    for fn in _functions(tree):
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
                sites.append(("compare", node))
            elif isinstance(node, ast.If) and node.orelse:
                sites.append(("if", node))
            elif isinstance(node, ast.IfExp):
                sites.append(("ifexp", node))
    if not sites:
        return None
    what, node = sites[int(rng.integers(len(sites)))]
    seg = lambda n: ast.get_source_segment(source, n)
    if what == "compare":
        text = f"{seg(node.left)} {_FLIP[type(node.ops[0])]} {seg(node.comparators[0])}"
    elif what == "ifexp":
        text = f"({seg(node.orelse)} if {seg(node.test)} else {seg(node.body)})"
    else:
        swapped = ast.If(test=node.test, body=node.orelse, orelse=node.body)
        indent = " " * node.col_offset
        text = "\n".join((indent + ln if k else ln) for k, ln in enumerate(ast.unparse(swapped).splitlines()))
    return splice(source, [(*_span(node), text)]), []


def _op_delete(source: str, tree: ast.Module, rng: np.random.Generator, space: _Space,
               s: MutateSettings) -> tuple[str, list[str]] | None:
    sites: list[tuple[ast.stmt, list[ast.stmt]]] = []
    for fn in _functions(tree):
        for node in ast.walk(fn):
            for fld in ("body", "orelse", "finalbody"):
                block = getattr(node, fld, None)
                if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
                    continue
                stmts = _body_statements(node) if node is fn and fld == "body" else block
                if node is fn and fld == "body" and stmts and isinstance(stmts[-1], ast.Return):
                    stmts = stmts[:-1]  # act without its final return could never act
                sites += [(st, block) for st in stmts]
    lines = source_lines(source)
    before = one_branch_reads(tree)
    while sites:  # a deletion that leaves a name assigned in one branch of an if only, read after it, is drawn again
        stmt, block = sites.pop(int(rng.integers(len(sites))))
        assert stmt.end_lineno is not None and stmt.end_col_offset is not None  # ast.parse sets positions
        whole = (not lines[stmt.lineno - 1][:stmt.col_offset].strip()
                 and not lines[stmt.end_lineno - 1].encode()[stmt.end_col_offset:].decode().strip().lstrip(";").strip())
        if len(block) == 1 or not whole:
            new = splice(source, [(*_span(stmt), "pass")])
        else:
            new = splice(source, [((stmt.lineno, 0), (stmt.end_lineno + 1, 0), "")])
        try:
            if not one_branch_reads(ast.parse(new)) - before:
                return new, []
        except SyntaxError:
            return new, []  # the checks refuse it, recorded
    return None


def _op_crossover(source: str, tree: ast.Module, rng: np.random.Generator, space: _Space, s: MutateSettings,
                  archive: Sequence[str] = ()) -> tuple[str, list[str]] | None:
    from ratchet.policy import _raw_parameters

    mine = {f.name: f for f in _functions(tree)}
    options = []
    for other in archive:
        if other == source:
            continue
        otree = ast.parse(other)
        for f in _functions(otree):
            if f.name in mine and ast.dump(f) != ast.dump(mine[f.name]):
                options.append((other, otree, f))
    if not options:
        return None
    other, otree, f = options[int(rng.integers(len(options)))]
    text = ast.get_source_segment(other, f)
    if text is None:  # no positions: nothing to copy
        return None
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = [(*_span(mine[f.name]), text)]
    # helpers the incoming function calls that this program lacks come along (appended at the end)
    theirs = {g.name: g for g in otree.body if isinstance(g, ast.FunctionDef)}
    names = {n.id for n in ast.walk(f) if isinstance(n, ast.Name)}
    extra = [seg for n in sorted(names) if n in theirs and n not in mine
             and not any(isinstance(s_, ast.FunctionDef) and s_.name == n for s_ in tree.body)
             if (seg := ast.get_source_segment(other, theirs[n])) is not None]
    if extra:
        end = len(source_lines(source)) + 1
        edits.append(((end, 0), (end, 0), ("\n" if source.endswith("\n") else "\n\n") + "\n\n".join(extra) + "\n"))
    # parameters it reads that this program does not declare come along with their declarations
    used = {n.slice.value for g in [f] + [theirs[n] for n in names if n in theirs] for n in ast.walk(g)
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "params"
            and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)}
    have, spec = _declared(source), _raw_parameters(other)
    entries = {}
    for name in sorted(used - have):
        p = spec.get(name)
        if isinstance(p, (list, tuple)) and len(p) == 3:
            p = {"default": p[0], "low": p[1], "high": p[2]}
        if not isinstance(p, dict) or "shape" in p or p.get("type", "float") != "float":
            return None  # an array, int or categorical declaration is not carried over: no crossover here
        entries[name] = (float(p["default"]), float(p["low"]), float(p["high"]))
    return add_parameters(source, entries, edits), []


_OPS = {"constant": _op_constant, "term": _op_term, "guard": _op_guard, "swap": _op_swap, "delete": _op_delete}


def mutate_source(source: str, operator: str, rng: np.random.Generator, space: _Space,
                  settings: MutateSettings | None = None, archive: Sequence[str] = ()) -> tuple[str, list[str]] | None:
    """Apply one mutation operator to policy source.

    Args:
        source: A valid policy file's text.
        operator: One of :data:`OPERATORS`.
        rng: Every random choice comes from it.
        space: The task's spaces (:class:`_Space`).
        settings: Bounds for new parameters (defaults when None).
        archive: Other programs' sources, for ``crossover``.

    Returns:
        ``(new source, names of the parameters the mutation introduced)``, or None when the operator
        finds nothing to mutate. The new source is not checked here (see :func:`check_source`).
    """
    s = settings or MutateSettings()
    tree = ast.parse(source)
    if operator == "crossover":
        return _op_crossover(source, tree, rng, space, s, archive)
    return _OPS[operator](source, tree, rng, space, s)


class MutationRefiner(Refiner):
    """Structural mutations of programs drawn from an archive of elites (see the module doc).

    Args:
        space: The task's spaces (:class:`_Space`).
        settings: :class:`MutateSettings`.
        dims: The task's sizes for array shapes written as ``"obs"``/``"act"``.
        name: The arm name recorded as its candidates' ``refiner``.
        observation_names: Names of the observation's elements, as the critique's failure modes use them.
        step_limit: The task's time limit (env steps), for the behaviour descriptor; None without one.
        functions: The functions a policy defines for the task (:attr:`ratchet.tasks.Task.functions`);
            default ``act``.
    """

    def __init__(self, space: _Space, settings: MutateSettings | None = None, dims: Mapping[str, int] | None = None,
                 name: str = "mutate", observation_names: Sequence[str] = (), step_limit: int | None = None,
                 functions: Mapping[str, int] | None = None) -> None:
        self.space, self.settings, self.dims, self.name = space, settings or MutateSettings(), dims, name
        self.functions = dict(functions or {"act": 2})
        self.observation_names = list(observation_names)
        self.step_limit = step_limit
        self.archive = self.settings.new_archive()
        self._tried: set[str] = set()  # digests of parents' sources and of mutants already proposed or rejected
        self._programs: dict[str, PolicyProgram] = {}  # digest -> checked program, of the mutants that passed their checks
        self._rejections: list[Rejection] = []
        # candidate id -> (operator, program key, candidate) of the last propose
        self._proposed: dict[str, tuple[str, str, Candidate]] = {}
        self._incumbent: Candidate | None = None
        self._generation = 0
        # operator -> [mutants that beat the incumbent on their training seeds, mutants evaluated]
        self.operator_record: dict[str, list[int]] = {op: [0, 0] for op in self.settings.operators}

    @property
    def population_size(self) -> int:
        """Candidates per generation: ``programs × variants`` at most."""
        return self.settings.programs * self.settings.variants

    def generation_cost(self) -> GenerationCost:
        """Up to ``programs × variants`` new candidates; no recommendation."""
        return GenerationCost(proposals=self.population_size)

    def _operator(self, rng: np.random.Generator) -> str:
        """An operator drawn with probability ∝ its posterior mean rate of beating the incumbent
        ((1 + wins) / (2 + tries), a Beta(1, 1) prior): adaptive operator selection by credit assignment."""
        ops = self.settings.operators
        w = np.array([(1 + self.operator_record[op][0]) / (2 + self.operator_record[op][1]) for op in ops])
        return ops[int(rng.choice(len(ops), p=w / w.sum()))]

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """``programs`` new programs, each with up to ``variants`` parameter settings.

        ``parent`` is the incumbent. Each program starts from the incumbent or from an elite of the
        archive (:func:`~ratchet.refiners.archive.draw_parent`); an elite is, with probability
        ``tune_share``, proposed again with its parameters perturbed (its numbers tuned further before any
        gate sees it; the elite itself comes again too, so its fitness is re-estimated on new seeds) instead
        of mutated. Mutants that fail :func:`check_source` are kept for :meth:`take_rejections` instead.
        """
        s = self.settings
        self._generation += 1
        self._incumbent = parent
        self.archive.protect(parent.id)
        self.space.focus, self.space.direction = feature_focus(critique, self.observation_names)
        out: list[Candidate] = []
        self._proposed = {}

        def add(cand: Candidate, op: str, key: str) -> None:
            if cand.id not in self._proposed and cand.id != parent.id:
                self._proposed[cand.id] = (op, key, cand)
                out.append(cand)

        if parent.kind in FOLDER_KINDS:  # a folder in any language: its marked regions' numbers are what changes
            self._mutate_numbers(parent, rng, add)
            return out

        made, attempts = 0, 0
        while made < s.programs and attempts < 4 * s.programs:
            attempts += 1
            origin = draw_parent(self.archive, parent, rng, s.incumbent_share)
            if origin.id != parent.id and rng.random() < s.tune_share:  # tune an elite's numbers further
                program = check_source(origin.source, dims=self.dims, functions=self.functions)
                made += 1
                for values in param_variants(program, rng, s.variants, sigma=s.sigma, center=origin.params):
                    add(Candidate.create(origin.source, values, parent_id=origin.id, refiner=f"{self.name}-tune"),
                        "tune", digest(origin.source))
                continue
            try:
                base = baked_source(origin)
            except PolicyError as exc:  # its values cannot be written back as defaults: not a parent
                self._rejections.append(Rejection(self.name, origin.id, f"cannot write the parent's values into "
                                                  f"its source: {exc}", None, {"operator": "bake"}))
                continue
            self._tried.add(digest(base))
            op = self._operator(rng)
            others = []
            if op == "crossover":  # the second parent: another elite
                other = self.archive.sample(rng, exclude=[origin.id])
                others = [baked_source(other.candidate)] if other is not None else []
            result = mutate_source(base, op, rng, self.space, s, others)
            if result is None:
                continue
            new, fresh = result
            key = digest(new)
            again = key in self._programs
            if again:  # drawn before: it comes again with new numbers (a few draws do not exhaust a rewrite)
                program = self._programs[key]
            elif key in self._tried:  # the parent itself, or a program that failed its checks
                continue
            else:
                self._tried.add(key)
                try:
                    program = check_source(new, dims=self.dims, functions=self.functions)
                except PolicyError as exc:
                    self._rejections.append(Rejection(self.name, origin.id, str(exc), new, {"operator": op}))
                    continue
                self._programs[key] = program
            made += 1
            # at its defaults a constant made a parameter, a zero-weight term or a guard that never fires
            # behaves as its parent: that setting would spend episodes learning nothing; a program drawn
            # again was tried at its defaults already
            skip = int(again or op in ("constant", "term", "guard"))
            variants = param_variants(program, rng, s.variants + skip, fresh, s.sigma)[skip:]
            for values in variants:
                add(Candidate.create(new, values, parent_id=origin.id, refiner=f"{self.name}-{op}"), op, key)
        return out

    def _mutate_numbers(self, parent: Candidate, rng: np.random.Generator, add: Any) -> None:
        """The numbers of a folder's marked regions (:mod:`ratchet.regions`; the parameters of a ``source``
        policy): ``programs`` parents drawn as for programs, each proposed with ``variants`` settings, either all
        its numbers perturbed around its values (``tune``) or, half of the time, one number drawn anew across its
        bounds and the others perturbed (``constant``: a literal given a new value, not only nudged)."""
        from ratchet.policies import read_program

        s = self.settings
        for _ in range(s.programs):
            origin = draw_parent(self.archive, parent, rng, s.incumbent_share)
            program = read_program(origin.kind, origin.source)
            if not program.parameters:
                return
            op = "constant" if rng.random() < 0.5 else "tune"
            fresh = [program.parameters[int(rng.integers(len(program.parameters)))].name] if op == "constant" else []
            for values in param_variants(program, rng, s.variants + 1, fresh, s.sigma, center=origin.params)[1:]:
                add(Candidate.create(origin.source, values, parent_id=origin.id, refiner=f"{self.name}-{op}",
                                     kind=origin.kind, artifacts=origin.artifacts), op, digest(origin.source))

    def take_rejections(self) -> list[Rejection]:
        """Proposals that failed their checks since the last call (the loop records them)."""
        out, self._rejections = self._rejections, []
        return out

    def observe(self, evaluations: Sequence[Evaluation]) -> None:
        """Offer the proposals to the archive, scored against the incumbent on the same seeds
        (:func:`~ratchet.refiners.archive.offer_generation`), and credit each mutation operator whose
        mutant's best setting beat the incumbent (see :meth:`_operator`)."""
        if self._incumbent is None:
            return
        # where the incumbent's observation elements live (a guard added to it acts there); the proposals' when
        # the loop did not run the incumbent
        own = [e for e in evaluations if e.candidate_id == self._incumbent.id]
        self.space.see(own or evaluations)
        gains = offer_generation(self.archive, self._incumbent, [c for _, _, c in self._proposed.values()],
                                 evaluations, self._generation, self.step_limit)
        best: dict[tuple[str, str], float] = {}
        for cid, gain in gains.items():
            op, key, _ = self._proposed[cid]
            best[(op, key)] = max(best.get((op, key), -math.inf), gain)
        for (op, _), gain in best.items():
            if op in self.operator_record:
                self.operator_record[op][1] += 1
                self.operator_record[op][0] += int(gain > 0)


def _build(settings: MutateSettings, name: str, ctx: Any) -> list[MutationRefiner]:
    from ratchet.policy import space_dims

    observation_space, action_space = ctx.task.spaces()  # made once in the driver (an env task), or none
    space = _Space(observation_space, action_space)
    dims = space_dims(observation_space, action_space) if observation_space is not None else {}
    names = getattr(ctx.task, "observation_names", None)
    names = (names(space.obs_dim) if callable(names) else names) if space.obs_dim else None
    return [MutationRefiner(space, settings, dims, name, names or [f"obs[{i}]" for i in range(space.obs_dim)],
                            getattr(ctx.task, "step_limit", None), dict(ctx.task.functions))]


def _kinds() -> dict[str, Any]:
    from ratchet.refiners.registry import RefinerKind

    return {"mutate": RefinerKind(MutateSettings, ("program", "source"), _build,
                                  hint="mutate rewrites a program policy's source (a source folder's numbers)",
                                  changes_code=True, generation_size=lambda s: s.programs * s.variants)}


KINDS = _kinds()
