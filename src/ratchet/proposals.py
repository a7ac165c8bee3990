"""What the loop does with a refiner's proposals that carry new source, whatever the refiner's kind:
check the source before any episode runs, record the ones that fail, and diff a promoted program
against the incumbent's.

A refiner may return candidates whose ``source`` is a new program (the ``mutate`` and ``llm`` kinds do).
Before any episode runs, the new source must pass :func:`check_source`: it parses, meets the
policy-file contract (:func:`ratchet.policy.parse_policy`: a literal ``PARAMETERS``, an
``act(observation, params)``), and passes quick static checks that catch what would otherwise fail
every episode (an undefined name, a variable read where no path has assigned it yet, a ``params["x"]`` that
``PARAMETERS`` does not declare, top-level code that would run on import, an import outside a short
allow-list). A source that fails is a
:class:`Rejection`: the loop records it (``proposal_rejected``) with its reason, and it never reaches a
worker. The checks are not the security boundary (workers are sandboxed and the env stays out of the
policy's reach); they keep machine-written mistakes from costing episodes.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ratchet.errors import PolicyError, RatchetError
from ratchet.ledger.events import RejectionKind
from ratchet.policy import ACT, Candidate, PolicyProgram, export_source, parse_policy

__all__ = [
    "ALLOWED_IMPORTS",
    "MAX_SOURCE_CHARS",
    "NORMAL_FORMS",
    "TUNED",
    "Rejection",
    "baked_source",
    "check_source",
    "file_normal_form",
    "folder_normal_form",
    "normal_id",
    "one_branch_reads",
    "promotion_changes",
    "promotion_diff",
    "python_normal_form",
    "register_normal_form",
    "source_diff",
    "structure_source",
    "text_normal_form",
    "value_changes",
]

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
        kind: Why, as the ledger records it for counting (``proposal_rejected`` ``kind``).
    """

    refiner: str
    parent_id: str | None
    reason: str
    source: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    kind: RejectionKind = RejectionKind.UNUSABLE


def check_source(source: str, *, dims: Mapping[str, int] | None = None,
                 functions: Mapping[str, int] | None = None) -> PolicyProgram:
    """Check new policy source without running it; return its program.

    Args:
        source: Policy file text.
        dims: The task's sizes (:func:`ratchet.policy.space_dims`) for shapes written as ``"obs"``/``"act"``.
        functions: The functions the task calls (:attr:`ratchet.tasks.Task.functions`); default ``act``.

    Returns:
        The parsed :class:`~ratchet.policy.PolicyProgram`.

    Raises:
        PolicyError: with a one-line reason: too long, a syntax error, the policy-file contract
            (:func:`~ratchet.policy.parse_policy`), top-level statements other than imports,
            assignments and definitions, a disallowed import or call, an undefined name (or one only another
            function's own variable has), a local variable read where no path has assigned it, or a
            ``params[...]`` key ``PARAMETERS`` does not declare.
    """
    if not isinstance(source, str) or not source.strip():
        raise PolicyError("empty source")
    if len(source) > MAX_SOURCE_CHARS:
        raise PolicyError(f"source is {len(source):,} characters, more than the {MAX_SOURCE_CHARS:,} allowed")
    functions = ACT if functions is None else functions
    program = parse_policy(source, "<proposal>", dims=dims, functions=functions)
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
    for fn in (s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name in functions):
        inner = [n for n in ast.walk(fn) if n is not fn]
        what = "an action" if fn.name == "act" else "a value"
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in inner):
            raise PolicyError(f"<proposal>:{fn.lineno}: {fn.name} is a generator (it yields); it must return {what}")
        if not any(isinstance(n, ast.Return) and n.value is not None for n in inner):
            raise PolicyError(f"<proposal>:{fn.lineno}: {fn.name} never returns {what} (no return statement with a "
                              "value)")
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
        _check_module_reads(tree)
    _check_reads_before_assignment(tree)
    _check_module_chains(tree)
    _check_params_keys(tree, {p.name for p in program.parameters})
    return program


#: Submodules of an allowed module that reach past a policy's business (C libraries, build and test tools).
_DENIED_SUBMODULES = frozenset({"ctypeslib", "f2py", "distutils", "testing"})


def _allowed_module(module: Any) -> bool:
    parts = str(getattr(module, "__name__", "")).split(".")
    return parts[0] in ALLOWED_IMPORTS and not any(p in _DENIED_SUBMODULES or p.startswith("_") for p in parts[1:])


def _check_module_chains(tree: ast.Module) -> None:
    """No chain of attributes leaves the allowed modules: a private attribute (``random._os``) anywhere but on
    ``self``/``cls``; an attribute of an allowed module that is a module outside the allow-list
    (``typing.sys``, ``numpy.lib.npyio.os``), also through a name bound to a module (``r = random``) or
    imported from one (``from typing import sys``); ``getattr`` with a name not written out. The allowed
    modules are looked at in the driver (they are the standard library and numpy; no policy code runs).
    A filter against machine-written mistakes and obvious escapes; the sandbox is the boundary."""
    import importlib
    import types

    def resolve(dotted: str) -> Any:
        root, *rest = dotted.split(".")
        if root not in ALLOWED_IMPORTS:
            return None
        try:
            obj: Any = importlib.import_module(root)
        except ImportError:
            return None
        for part in rest:
            obj = getattr(obj, part, None)
        return obj

    def chain(node: ast.expr) -> list[str] | None:
        names = []
        while isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        return [node.id, *reversed(names)] if isinstance(node, ast.Name) else None

    def refuse(node: ast.AST, what: str) -> None:
        raise PolicyError(f"<proposal>:{getattr(node, 'lineno', 0)}: {what} is not allowed in a policy (only the "
                          "public parts of the allowed modules are)")

    modules: dict[str, Any] = {}  # names bound to a module anywhere in the file
    for _ in range(2):  # twice: an alias may be bound after the line that binds its source
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    modules[a.asname or a.name.split(".")[0]] = resolve(a.name if a.asname else a.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name.startswith("_") and node.module != "__future__":
                        refuse(node, f"importing the private name {a.name!r} from {node.module}")
                    value = getattr(resolve(node.module), a.name, None)
                    if isinstance(value, types.ModuleType):
                        if not _allowed_module(value):
                            refuse(node, f"importing {a.name!r} (the module {value.__name__}) from {node.module}")
                        modules[a.asname or a.name] = value
            elif isinstance(node, ast.Assign) and (names := chain(node.value)) and names[0] in modules:
                value = modules[names[0]]
                for part in names[1:]:
                    value = getattr(value, part, None)
                if isinstance(value, types.ModuleType):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            modules[t.id] = value
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dunder = node.attr.startswith("__") and node.attr.endswith("__")
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if node.attr.startswith("_") and not dunder and not on_self:
                refuse(node, f"the private attribute {node.attr!r}")
            names = chain(node)
            if names and isinstance(modules.get(names[0]), types.ModuleType):
                obj = modules[names[0]]
                for i, part in enumerate(names[1:], 1):
                    obj = getattr(obj, part, None)
                    if isinstance(obj, types.ModuleType) and not _allowed_module(obj):
                        refuse(node, f"{'.'.join(names[:i + 1])} (the module {obj.__name__})")
                    if not isinstance(obj, types.ModuleType):
                        break
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and not name.value.startswith("_")):
                refuse(node, "getattr() with a name that is not a public name written out")


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


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_ENDS_BLOCK = (ast.Return, ast.Raise, ast.Break, ast.Continue)


def _binding(node: ast.AST) -> set[str]:
    """The names ``node`` itself binds (not its children)."""
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, (ast.Store, ast.Del)) else set()
    if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return {node.name} if node.name else set()
    if isinstance(node, ast.MatchMapping):
        return {node.rest} if node.rest else set()
    return set()


def _binds(node: ast.AST) -> set[str]:
    """Every name ``node`` (a statement, an expression, a pattern) may bind anywhere inside it, nested scopes
    included: an over-estimate of what it assigns, so a read after it is never taken for one before any assignment."""
    return {b for n in ast.walk(node) for b in _binding(n)}


def _own_scope(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The nodes of ``fn``'s own scope: its body, not the bodies of the functions, lambdas, classes and
    comprehensions in it (their names, and the defaults, decorators and first iterable evaluated here, are)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, _FUNCTIONS):
            todo += [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        elif isinstance(node, ast.Lambda):
            todo += [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        elif isinstance(node, ast.ClassDef):
            todo += [*node.decorator_list, *node.bases, *node.keywords]
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            todo.append(node.generators[0].iter)
        else:
            todo += list(ast.iter_child_nodes(node))
    return out


def _locals_of(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names local to ``fn`` (its arguments and the names bound in its own scope, less those declared
    ``global`` or ``nonlocal``). Walrus targets inside comprehensions are left out (an under-estimate: such a
    name is then not checked)."""
    own = _own_scope(fn)
    declared = {name for node in own if isinstance(node, (ast.Global, ast.Nonlocal)) for name in node.names}
    bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    bound |= {b for node in own for b in _binding(node)}
    return bound - declared


def _reads(node: ast.AST, hidden: frozenset[str] = frozenset()) -> list[ast.Name]:
    """The names ``node`` (an expression) reads when it is evaluated, in no particular order: not those in the
    bodies of lambdas and generator expressions (they run later, if ever), nor a comprehension's own targets."""
    if isinstance(node, ast.Name):
        return [node] if isinstance(node.ctx, ast.Load) and node.id not in hidden else []
    if isinstance(node, ast.Lambda):
        return [r for d in (*node.args.defaults, *(d for d in node.args.kw_defaults if d)) for r in _reads(d, hidden)]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        out = _reads(node.generators[0].iter, hidden)
        if isinstance(node, ast.GeneratorExp):
            return out
        inner = hidden | {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        parts: list[ast.AST] = [*node.generators[0].ifs, *(x for g in node.generators[1:] for x in (g.iter, *g.ifs))]
        parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        return out + [r for part in parts for r in _reads(part, inner)]
    return [r for child in ast.iter_child_nodes(node) for r in _reads(child, hidden)]


class _Unassigned(Exception):
    def __init__(self, node: ast.Name) -> None:
        super().__init__(node.id)
        self.node = node


def _flow(stmts: list[ast.stmt], maybe: set[str], local: set[str]) -> set[str]:
    """Walk ``stmts`` in order with ``maybe``, the local names some path may have assigned so far; returns it after
    them (an over-estimate). Code after a ``return``/``raise``/``break``/``continue`` of the block is not checked.

    Raises:
        _Unassigned: a local name is read where no path has assigned it.
    """

    def check(*exprs: ast.AST | None, also: set[str] | None = None) -> None:
        now = maybe | (also or set())
        for e in exprs:
            if e is None:
                continue
            now = now | {n.target.id for n in ast.walk(e) if isinstance(n, ast.NamedExpr)
                         and isinstance(n.target, ast.Name)}  # a walrus may bind before the read beside it
            for name in _reads(e):
                if name.id in local and name.id not in now:
                    raise _Unassigned(name)

    maybe = set(maybe)
    for stmt in stmts:
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) \
                    and stmt.target.id in local and stmt.target.id not in maybe:  # x += 1 reads x first
                raise _Unassigned(stmt.target)
            check(stmt.value)
            for t in targets:  # a[i] = v reads a and i
                if not isinstance(t, ast.Name):
                    check(*(c for n in ast.walk(t) if isinstance(n, (ast.Subscript, ast.Attribute))
                            for c in ast.iter_child_nodes(n) if not isinstance(c, ast.expr_context)))
            if stmt.value is not None:
                maybe |= _binds(stmt)
        elif isinstance(stmt, ast.If):
            check(stmt.test)
            tested = maybe | _binds(stmt.test)  # if (x := ...): binds x for both branches
            maybe = _flow(stmt.body, tested, local) | _flow(stmt.orelse, tested, local)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            check(stmt.iter)
            inside = maybe | _binds(stmt.iter) | _binds(stmt.target) | _binds(ast.Module(stmt.body, []))
            _flow(stmt.body, inside, local)
            maybe = _flow(stmt.orelse, inside, local) | inside
        elif isinstance(stmt, ast.While):
            check(stmt.test)
            inside = maybe | _binds(stmt.test) | _binds(ast.Module(stmt.body, []))
            _flow(stmt.body, inside, local)
            maybe = _flow(stmt.orelse, inside, local) | inside
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                check(item.context_expr)
                maybe |= _binds(item.context_expr) | (_binds(item.optional_vars) if item.optional_vars else set())
            maybe = _flow(stmt.body, maybe, local)
        elif isinstance(stmt, (ast.Try, ast.TryStar)):
            tried = maybe | _binds(ast.Module(stmt.body, []))
            after = _flow(stmt.body, maybe, local) | tried
            for handler in stmt.handlers:
                check(handler.type, also=tried)
                after |= _flow(handler.body, tried | ({handler.name} if handler.name else set()), local)
            after |= _flow(stmt.orelse, after, local)
            maybe = _flow(stmt.finalbody, after, local)
        elif isinstance(stmt, ast.Match):
            check(stmt.subject)
            maybe |= _binds(stmt.subject)
            after = set(maybe)
            for case in stmt.cases:
                bound = maybe | _binds(case.pattern)
                check(case.guard, also=bound)
                after |= _flow(case.body, bound, local) | bound
            maybe = after
        elif isinstance(stmt, _FUNCTIONS):
            check(*stmt.decorator_list, *stmt.args.defaults, *stmt.args.kw_defaults)
            maybe.add(stmt.name)
        elif isinstance(stmt, ast.ClassDef):
            check(*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords))
            maybe.add(stmt.name)
        elif isinstance(stmt, (ast.Delete, ast.Global, ast.Nonlocal, ast.Pass, ast.Break, ast.Continue)):
            pass  # del x: x may still be taken for assigned (an under-estimate of what is unassigned)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            maybe |= _binds(stmt)
        else:  # Expr, Return, Raise, Assert
            check(*(c for c in ast.iter_child_nodes(stmt) if isinstance(c, ast.expr)))
            maybe |= _binds(stmt)
        if isinstance(stmt, _ENDS_BLOCK):
            break
    return maybe


def _check_reads_before_assignment(tree: ast.Module) -> None:
    """A function that reads one of its local names where no path through it has assigned the name (a line deleted
    above the read, an assignment moved below it) raises UnboundLocalError every time it gets there: refused.
    Conservative: where any path may have assigned the name (an ``if`` branch, an earlier loop iteration, a
    ``try``), or the code cannot be reached, nothing is said (a name assigned in one branch of an ``if`` only and
    read after it passes: :func:`one_branch_reads` finds those, and the ``mutate`` refiner does not make them)."""
    for fn in ast.walk(tree):
        if not isinstance(fn, _FUNCTIONS):
            continue
        local = _locals_of(fn)
        params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        try:
            _flow(fn.body, params, local)
        except _Unassigned as exc:
            raise PolicyError(f"<proposal>:{exc.node.lineno}: {fn.name}() reads {exc.node.id!r} before any "
                              "assignment of it (UnboundLocalError whenever it gets there)") from None


def _surely_assigned(block: list[ast.stmt]) -> set[str] | None:
    """The names every path through ``block`` that goes on past its end assigns; None where no path does (it
    returns, raises, breaks or continues). Only ``if`` statements are followed into; another compound statement
    assigns nothing for sure here (an under-estimate)."""
    out: set[str] = set()
    for stmt in block:
        if isinstance(stmt, _ENDS_BLOCK):
            return None
        if isinstance(stmt, ast.If):
            body, orelse = _surely_assigned(stmt.body), _surely_assigned(stmt.orelse)
            if body is None and orelse is None:
                return None
            out |= (orelse or set()) if body is None else body if orelse is None else body & orelse
        elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom, *_FUNCTIONS,
                               ast.ClassDef)) and not (isinstance(stmt, ast.AnnAssign) and stmt.value is None):
            out |= _binds(stmt)
    return out


def one_branch_reads(tree: ast.Module) -> set[tuple[str, str]]:
    """``(function, name)`` for each local name a top-level function reads after an ``if`` that assigns it in one
    branch but not on every path through the ``if`` that goes on past it, with nothing above the ``if`` assigning it:
    UnboundLocalError whenever the other branch is taken. :func:`check_source` does not refuse these (valid code may
    read the name only where the same condition held); the ``mutate`` refiner uses this to not make them (deleting
    one branch's assignment). Names bound anywhere above the ``if`` (by line) or as arguments are left out."""
    out: set[tuple[str, str]] = set()
    for fn in (s for s in tree.body if isinstance(s, _FUNCTIONS)):
        local = _locals_of(fn)
        params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        for node in _own_scope(fn) + [fn]:
            for block in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
                if not isinstance(block, list):
                    continue
                for i, stmt in enumerate(block):
                    if not isinstance(stmt, ast.If) or (sure := _surely_assigned([stmt])) is None:
                        continue
                    above = params | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                                      and isinstance(n.ctx, ast.Store) and n.lineno < stmt.lineno}
                    one = (_binds(ast.Module(stmt.body + stmt.orelse, [])) & local) - sure - above
                    read = {n.id for later in block[i + 1:] for n in ast.walk(later)
                            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                    out |= {(fn.name, name) for name in one & read}
    return out


def _check_module_reads(tree: ast.Module) -> None:
    """A function that reads a name as a module global which the module never binds (only another function's
    local, or a class body's, has that name) raises NameError whenever it gets there: refused. Checked in each
    function's own scope, past its locals and those of the functions around it."""
    module = set(dir(builtins)) | _MODULE_NAMES | {"__builtins__"}
    for stmt in tree.body:
        module |= {stmt.name} if isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)) else _binds(stmt)
    module |= {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}

    def visit(node: ast.AST, enclosing: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _FUNCTIONS):
                visible = enclosing | _locals_of(child)
                for n in _own_scope(child):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in visible | module:
                        raise PolicyError(f"<proposal>:{n.lineno}: {child.name}() reads {n.id!r}, which the module "
                                          "never assigns (only another function's own variable has that name)")
                visit(child, visible)
            else:
                visit(child, enclosing)  # a class body's names are not visible to its methods

    visit(tree, set())


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


def baked_source(candidate: Candidate) -> str:
    """The candidate's source with its parameter values written in as the defaults
    (:func:`ratchet.policy.export_source`): the starting point of a structural edit, so a new program's
    defaults are the parent's tuned values."""
    return export_source(candidate.source, candidate.params) if candidate.params else candidate.source


def source_diff(old: str, new: str, max_lines: int = 80) -> str:
    """A unified diff ``old`` -> ``new`` (at most ``max_lines`` lines, then ``...``)."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), "parent", "candidate", lineterm="", n=1))
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)


#: What :func:`structure_source` writes in place of each parameter's default.
TUNED = "TUNED"


def structure_source(source: str) -> str:
    """``source`` with the default of every ``PARAMETERS`` entry replaced by :data:`TUNED`: the code's
    structure (its logic, the parameters' names and bounds) without the values a tuner changes. A source
    whose ``PARAMETERS`` is not a dict display (or that does not parse) comes back unchanged."""
    from ratchet.policy import _find_parameters_node

    try:
        node = _find_parameters_node(ast.parse(source))
    except (SyntaxError, ValueError):
        return source
    if not isinstance(node, ast.Dict):
        return source
    spans = []
    for val in node.values:
        target = None
        if isinstance(val, ast.Dict):
            target = next((v for k, v in zip(val.keys, val.values)
                           if isinstance(k, ast.Constant) and k.value == "default"), None)
        elif isinstance(val, (ast.Tuple, ast.List)) and val.elts:
            target = val.elts[0]
        if target is not None and target.end_lineno is not None and target.end_col_offset is not None:
            spans.append((target.lineno, target.col_offset, target.end_lineno, target.end_col_offset))
    lines = source.encode("utf-8").splitlines(keepends=True)
    starts = [0]
    for b in lines:
        starts.append(starts[-1] + len(b))
    data = source.encode("utf-8")
    for line, col, end_line, end in sorted(spans, reverse=True):
        data = data[:starts[line - 1] + col] + TUNED.encode() + data[starts[end_line - 1] + end:]
    return data.decode("utf-8")


def value_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The parameter values that differ between two candidates' ``params``, in ``new``'s order, then the
    removed ones: ``{"name", "from", "to"}`` with a number for a scalar (an int as an int; a bool as a bool), a
    one-line summary for an array and a text choice's literal (:func:`ratchet.policy.describe_value`: ``'greedy'``),
    and None on the side that lacks the parameter."""
    import numpy as np

    from ratchet.policy import describe_value

    def shown(v: Any) -> Any:
        if isinstance(v, (bool, int)):
            return v
        return float(v) if not isinstance(v, (str, list, tuple, np.ndarray)) else describe_value(v)

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, (str, bool)) or isinstance(b, (str, bool)):  # a choice: the same literal
            return type(a) is type(b) and a == b
        return bool(np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)))

    out = []
    for name in list(new) + [n for n in old if n not in new]:
        a, b = old.get(name), new.get(name)
        if a is not None and b is not None and same(a, b):
            continue
        out.append({"name": name, "from": None if a is None else shown(a), "to": None if b is None else shown(b)})
    return out


def promotion_changes(incumbent: Candidate, promoted: Candidate, max_lines: int = 400) -> dict[str, Any]:
    """What a structural promotion changed, for ``show`` and the report: ``source_diff``
    (:func:`promotion_diff`: every change, numbers included), ``structure_diff`` (the diff of the two
    sources with their defaults replaced by :data:`TUNED`, :func:`structure_source`: the code's structure
    alone; empty when only values changed) and ``value_changes`` (:func:`value_changes` of their values)."""
    return {"source_diff": promotion_diff(incumbent, promoted, max_lines),
            "structure_diff": source_diff(structure_source(incumbent.source), structure_source(promoted.source),
                                          max_lines=max_lines),
            "value_changes": value_changes(incumbent.params, promoted.params)}


def describe_value_changes(changes: Any) -> str:
    """:func:`value_changes` as lines for people: ``name: 0.3 → 0.52``, ``depth: 3 → 5``, ``rule: 'greedy' →
    'sorted'``, ``name: 0.7 (new)``, ``name: removed (was 0.3)``; entries that are not such dicts (a damaged ledger)
    are skipped."""
    def shown(v: Any) -> str:
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    lines = []
    for c in changes if isinstance(changes, list) else []:
        if not isinstance(c, Mapping) or "name" not in c:
            continue
        a, b = c.get("from"), c.get("to")
        if a is None:
            lines.append(f"{c['name']}: {shown(b)} (new)")
        elif b is None:
            lines.append(f"{c['name']}: removed (was {shown(a)})")
        else:
            lines.append(f"{c['name']}: {shown(a)} → {shown(b)}")
    return "\n".join(lines)


def promotion_diff(incumbent: Candidate, promoted: Candidate, max_lines: int = 400) -> str:
    """The code change of a promotion: :func:`source_diff` of the two sources with each side's values
    written in as its defaults (:func:`baked_source`), so the diff shows every change, numbers included;
    the plain sources where a side's values cannot be written in. A source folder's diff is of its files, its
    values written into their marked regions (:func:`ratchet.policies.source.folder_text`)."""
    from ratchet.policy import FOLDER_KINDS

    if incumbent.kind in FOLDER_KINDS and promoted.kind in FOLDER_KINDS:
        from ratchet.policies.source import folder_text

        return source_diff(folder_text(incumbent), folder_text(promoted), max_lines=max_lines)
    try:
        old, new = baked_source(incumbent), baked_source(promoted)
    except RatchetError:
        old, new = incumbent.source, promoted.source
    return source_diff(old, new, max_lines=max_lines)


def python_normal_form(source: str) -> str:
    """What of a Python program's source decides what it does, as text: the :func:`ast.dump` of its tree (no
    comments, no formatting) without docstrings and other statements that are only a constant, with each
    ``PARAMETERS`` default replaced by :data:`TUNED` (:func:`structure_source`; a candidate's values come with it,
    not from its defaults). Two sources that differ only in whitespace, comments, docstrings or defaults have the
    same normal form. A source that does not parse comes back unchanged."""
    try:
        tree = ast.parse(structure_source(source))
    except (SyntaxError, ValueError):
        return source
    for node in ast.walk(tree):
        for name, stmts in ast.iter_fields(node):  # every statement list: bodies, else branches, finally blocks
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            kept = [s for s in stmts if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))
    return ast.dump(tree)


def text_normal_form(source: str, line_comments: tuple[str, ...] = ("#",),
                     block_comments: tuple[tuple[str, str], ...] = ()) -> str:
    """A program in any language without its comments and whitespace (a space is kept only between two words, so
    ``int x`` stays apart): what a new language's normal form may be (:func:`register_normal_form`) when nothing
    parses it. Text inside ``"..."`` and ``'...'`` string literals (backslash escapes) is kept as it is, comment
    markers and spaces in it included.

    Args:
        source: The program's text.
        line_comments: Markers that start a comment running to the end of the line (``"#"``, ``"//"``, ``"--"``).
        block_comments: ``(start, end)`` markers of comments that may span lines (``("/*", "*/")``).
    """
    out: list[str] = []
    gap = False  # whitespace (or a comment) since the last text kept

    def keep(text: str) -> None:
        nonlocal gap
        if gap and out and (out[-1][-1].isalnum() or out[-1][-1] == "_") and (text[0].isalnum() or text[0] == "_"):
            out.append(" ")  # only where two words would otherwise join
        out.append(text)
        gap = False

    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            keep(source[i:j + 1])
            i = j + 1
        elif (m := next((m for m in line_comments if source.startswith(m, i)), None)) is not None:
            end = source.find("\n", i + len(m))
            i, gap = (n if end < 0 else end), True
        elif (b := next((b for b in block_comments if source.startswith(b[0], i)), None)) is not None:
            end = source.find(b[1], i + len(b[0]))
            i, gap = (n if end < 0 else end + len(b[1])), True
        elif c.isspace():
            i, gap = i + 1, True
        else:
            keep(c)
            i += 1
    return "".join(out)


#: File extensions (lower case) of languages with ``//`` and ``/* */`` comments whose line breaks matter only in
#: preprocessor lines (C, C++, CUDA): those lines are kept as they are (``#include`` is code, not a comment).
_C_EXTENSIONS = frozenset({"c", "h", "cc", "cpp", "cxx", "c++", "hpp", "hh", "hxx", "h++", "cu", "cuh", "ino"})
#: ... and those where a line break may end a statement (Go's and JavaScript's semicolon insertion): kept.
_BRACE_EXTENSIONS = frozenset({"rs", "go", "java", "js", "mjs", "cjs", "ts", "kt", "scala", "cs", "swift", "dart",
                               "zig"})
#: Shell scripts: ``#`` comment lines dropped (a ``#!`` line kept), line breaks kept.
_SHELL_EXTENSIONS = frozenset({"sh", "bash"})


def _c_normal_form(text: str) -> str:
    """A C-family file without comments and whitespace (:func:`text_normal_form`), each preprocessor line (with its
    ``\\`` continuations) kept as it is on a line of its own: their words and line breaks are what they mean."""
    out: list[str] = []
    chunk: list[str] = []
    directive = False
    for line in text.split("\n"):
        if directive or line.lstrip().startswith("#"):
            if chunk:
                out.append(text_normal_form("\n".join(chunk), ("//",), (("/*", "*/"),)))
                chunk = []
            out.append(line.rstrip())
            directive = line.rstrip().endswith("\\")
        else:
            chunk.append(line)
    if chunk:
        out.append(text_normal_form("\n".join(chunk), ("//",), (("/*", "*/"),)))
    return "\n".join(x for x in out if x)


def _lines_normal_form(text: str) -> str:
    """A ``//`` and ``/* */`` file whose line breaks may matter, without its comments and other whitespace: each
    line's :func:`text_normal_form`, empty lines dropped (a block comment spanning lines loses only its first line's
    part: the rest is kept as text, so nothing that may be code is ever dropped)."""
    lines = (text_normal_form(line, ("//",), (("/*", "*/"),)) for line in text.split("\n"))
    return "\n".join(x for x in lines if x)


def file_normal_form(path: str, text: str) -> str:
    """One file of a source folder without what does not change what it does, by its extension: Python the
    :func:`python_normal_form` of its tree; C, C++ and CUDA without ``//`` and ``/* */`` comments and whitespace,
    preprocessor lines kept as they are; Rust, Go, Java, JavaScript (and other ``//`` languages) the same with their
    line breaks kept; shell scripts without ``#`` comment lines; any other file its exact text. A normal form never
    joins two programs that behave differently only through the comments or whitespace it removes (a literal's text
    in a string is kept)."""
    ext = path.rsplit("/", 1)[-1].rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if ext == "py":
        return python_normal_form(text)
    if ext in _C_EXTENSIONS:
        return _c_normal_form(text)
    if ext in _BRACE_EXTENSIONS:
        return _lines_normal_form(text)
    if ext in _SHELL_EXTENSIONS:
        return "\n".join(ln.rstrip() for ln in text.split("\n")
                         if ln.strip() and not (ln.lstrip().startswith("#") and not ln.startswith("#!")))
    return text


def folder_normal_form(source: str) -> str:
    """A source folder's document (:class:`ratchet.policies.source.Folder`) with each file in its normal form
    (:func:`file_normal_form`) and the numbers of its marked regions written as :data:`TUNED` (a candidate's values
    come with it, not from its literals); its paths, commands and limits as they are. A document that is not a
    folder, or whose regions cannot be read, comes back unchanged."""
    import dataclasses

    from ratchet.policies.source import Folder

    try:
        folder = Folder.from_source(source)
        files = {}
        for path, text in folder.files.items():
            for lit in sorted(folder.literals.get(path, ()), key=lambda x: x.start, reverse=True):
                text = text[:lit.start] + TUNED + text[lit.end:]
            files[path] = file_normal_form(path, text)
    except RatchetError:
        return source
    return dataclasses.replace(folder, files=files).to_source()


#: Each policy kind's normal form of its source (:func:`normal_id`), by kind: a kind not named here is compared
#: by its exact content. A new kind registers its own with :func:`register_normal_form`.
NORMAL_FORMS: dict[str, Callable[[str], str]] = {"program": python_normal_form, "residual": python_normal_form,
                                                 "source": folder_normal_form}


def register_normal_form(kind: str, normal_form: Callable[[str], str]) -> None:
    """Compare candidates of policy ``kind`` by ``normal_form(source)`` (with their values and artifacts) rather
    than by their exact source: e.g. ``lambda s: text_normal_form(s, ("//",), (("/*", "*/"),))`` for C."""
    NORMAL_FORMS[kind] = normal_form
    _normal_form.cache_clear()


@functools.lru_cache(maxsize=256)
def _normal_form(kind: str, source: str) -> str:
    """``NORMAL_FORMS[kind](source)``, remembered: a search that moves only values (CMA-ES: a generation of 20
    candidates of one source) parses and dumps that source once, not once per candidate (3.8 s of a 35 s
    lunar_lander run did that)."""
    return NORMAL_FORMS[kind](source)


def normal_id(candidate: Candidate) -> str:
    """A content id (as :attr:`~ratchet.policy.Candidate.id`, 12 hex characters) of the candidate's normal form:
    its kind's normal form of its source (:data:`NORMAL_FORMS`; the exact source for a kind without one), its
    parameter values and its artifacts. Two candidates with the same normal id behave the same: the run scores
    only the first (:meth:`ratchet.services.RunServices.screen_proposals`)."""
    if candidate.kind not in NORMAL_FORMS or not candidate.source:
        return candidate.id
    return Candidate.create(_normal_form(candidate.kind, candidate.source), candidate.params, kind=candidate.kind,
                            artifacts=candidate.artifacts).id
