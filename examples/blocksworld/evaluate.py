"""Blocksworld as an evaluator task: a generalized planner is scored by a plan validator.

Every instance is a PDDL problem of the classic 4-operator blocksworld (``domain.pddl``, unit costs) made
from its seed: random initial towers and random goal towers. The seed carries its split (``seed % 3``:
0 train, 1 validation, 2 test); training problems have 4-7 blocks, validation and test problems 8-10, so
held-out problems are larger than any training problem (the policy has to generalize).

The policy is one function, ``plan(state, goal, params)``, that returns a plan for *any* problem of the
domain. Its arguments are numbers only (they cross into the sandbox): ``state[i]`` is the block block ``i``
sits on, ``-1`` for the table; ``goal[i]`` likewise, ``-2`` where the goal says nothing about block ``i``
(IPC goals name only some ``on``/``ontable`` facts). The hand is empty in every initial state. The plan
comes back as an int array ``(k, 3)``: rows ``(action, x, y)`` with action 0 pick-up(x), 1 put-down(x),
2 stack(x, y), 3 unstack(x, y); ``y = -1`` for pick-up and put-down.

unified-planning checks everything: the problem is read by its PDDL reader, the plan decoded into its
``ActionInstance`` objects and validated by its ``sequential_plan_validator`` (the authority on
validity). An invalid plan is the instance's failure ("invalid plan"), its text names the first
failing step and its unmet preconditions (``step 7 stack(b3, b1): clear(b1) is false``); a valid plan
that leaves goal facts false fails as "goal not reached". A valid plan scores
``reference_cost / plan_cost``, where the reference is Fast Downward's optimal ``astar(lmcut())`` (through
up-fast-downward's ``fast-downward-opt``), so 1.0 is an optimal plan and every valid plan scores in (0, 1].
(lama-first, the satisficing default, is fast but finds plans 10-40 % longer than the optimum here, often
longer than the start policy's: a poor yardstick. The optimal search limits the problem sizes: it solves
10 blocks in about 0.5 s, with a tail to about 6 s, but 12 blocks can take more than 20 s.) An in-process memo keeps
each seed's reference plan (no file cache: the evaluator stays a pure function of the seed for replay).

Diagnostics: ``plan_length``, ``valid``, ``failed_step`` (1-based, 0 when none), and for valid plans
``reference_cost``, ``cost_ratio`` (plan cost / reference cost), ``goal_facts_false``; ``policy_time_s``
and ``reference_time_s`` are wall-clock seconds (the policy's call, the reference planner's first solve),
so they are the only numbers here that differ between two evaluations of the same instance.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from pathlib import Path

import numpy as np

try:  # ratchet's own error, so the run records the instance as the candidate's failure
    from ratchet.tasks.evaluator import CandidateError
except ImportError:  # pragma: no cover - standalone use (benchmarks/planning.py) without evaluator tasks
    class CandidateError(Exception):  # type: ignore[no-redef]
        """The candidate's answer is unusable (wrong shape, out of range)."""


FUNCTIONS = {
    "plan": "plan(state, goal, params) -> np.ndarray: state is an int array (n,), state[i] = the block "
            "block i sits on or -1 for the table (the hand is empty); goal is an int array (n,) in the same "
            "code, -2 where the goal does not constrain block i; return the plan as an int array (k, 3) of "
            "rows (action, x, y): 0 pick-up(x), 1 put-down(x), 2 stack(x, y), 3 unstack(x, y), y = -1 for "
            "pick-up and put-down; at most 10 * n + 10 rows",
}
DESCRIPTION = ("Generalized planning in the 4-operator blocksworld (unit costs): one program must return a "
               "valid plan for any problem, and short plans score higher. Score = the optimal plan's cost (Fast "
               "Downward, A* with LM-cut) / the plan's cost for a valid plan that reaches the goal, 0 otherwise. "
               "Training problems have 4-7 blocks, held-out problems 8-10.")
SUCCESS = "the plan is valid and reaches the goal"

DOMAIN_PATH = Path(__file__).with_name("domain.pddl")
ACTIONS = ("pick-up", "put-down", "stack", "unstack")
TRAIN_BLOCKS = (4, 7)      # inclusive ranges of the number of blocks per split
HELD_OUT_BLOCKS = (8, 10)
REFERENCE_PLANNER = "fast-downward-opt"   # up-fast-downward's optimal engine: A* with the LM-cut heuristic
TOWER_BREAK = 0.3          # chance that two blocks next in the random order start separate towers
FREE_BOTTOM = 0.5          # chance that a goal tower's bottom block has no ontable goal


def max_steps(n: int) -> int:
    """The longest plan the evaluator reads for ``n`` blocks."""
    return 10 * n + 10


def digest(pddl: str) -> str:
    return hashlib.sha256(pddl.encode()).hexdigest()[:16]


def _towers(rng: np.random.Generator, n: int) -> list[list[int]]:
    order = [int(b) for b in rng.permutation(n)]
    towers = [[order[0]]]
    for b in order[1:]:
        if rng.random() < TOWER_BREAK:
            towers.append([b])
        else:
            towers[-1].append(b)
    return towers


def _on(towers: list[list[int]], n: int) -> list[int]:
    on = [-1] * n
    for tower in towers:
        for below, above in itertools.pairwise(tower):
            on[above] = below
    return on


def goal_facts(goal) -> list[tuple[int, int]]:
    """The goal's facts as (block, support) pairs, support -1 the table."""
    return [(i, int(g)) for i, g in enumerate(goal) if g != -2]


def _fact_text(block: int, support: int) -> str:
    return f"(ontable b{block})" if support == -1 else f"(on b{block} b{support})"


def problem_pddl(seed: int, init, goal) -> str:
    n = len(init)
    above = {int(s) for s in init if s >= 0}
    facts = ["(handempty)"] + [_fact_text(i, int(s)) for i, s in enumerate(init)]
    facts += [f"(clear b{i})" for i in range(n) if i not in above]
    goals = [_fact_text(i, s) for i, s in goal_facts(goal)]
    return (f"(define (problem bw-{seed}-n{n})\n  (:domain blocksworld)\n"
            f"  (:objects {' '.join(f'b{i}' for i in range(n))})\n"
            f"  (:init {' '.join(facts)})\n  (:goal (and {' '.join(goals)})))\n")


def make_instance(seed: int) -> dict:
    """Problem ``seed``: 4-7 blocks for a training seed (seed % 3 == 0), 8-10 for validation and test.
    A plain dict (picklable; the unified-planning objects are built on use): ``seed``, ``n``, ``init`` and
    ``goal`` (lists in the policy's code), ``pddl`` (the problem text; domain: domain.pddl) and ``digest``."""
    seed = int(seed)
    rng = np.random.default_rng(seed)
    low, high = TRAIN_BLOCKS if seed % 3 == 0 else HELD_OUT_BLOCKS
    n = int(rng.integers(low, high + 1))
    init = _on(_towers(rng, n), n)
    while True:
        towers = _towers(rng, n)
        goal = _on(towers, n)
        for tower in towers:
            if rng.random() < FREE_BOTTOM:
                goal[tower[0]] = -2
        if any(goal[i] != init[i] for i, _ in goal_facts(goal)):   # not already solved
            break
    return instance(seed, init, goal)


def instance(seed: int, init, goal) -> dict:
    """The instance dict of a problem given in the policy's code (``make_instance``; tests build tiny ones)."""
    init, goal = [int(s) for s in init], [int(g) for g in goal]
    pddl = problem_pddl(seed, init, goal)
    return {"seed": int(seed), "n": len(init), "init": init, "goal": goal, "pddl": pddl, "digest": digest(pddl)}


# --- unified-planning: problems, validation, the reference planner ------------------------------------------

_UP: dict = {}
_PROBLEMS: dict[tuple[int, str], object] = {}
_REFERENCE: dict[tuple[int, str], tuple[int, float]] = {}


def _up():
    """unified-planning's pieces, imported once (the import takes about a second)."""
    if not _UP:
        from unified_planning.engines import ValidationResultStatus
        from unified_planning.io import PDDLReader
        from unified_planning.plans import ActionInstance, SequentialPlan
        from unified_planning.shortcuts import OneshotPlanner, PlanValidator, get_environment

        get_environment().credits_stream = None   # no engine credits on stdout
        _UP.update(reader=PDDLReader(), ActionInstance=ActionInstance, SequentialPlan=SequentialPlan,
                   OneshotPlanner=OneshotPlanner, PlanValidator=PlanValidator, VALID=ValidationResultStatus.VALID,
                   domain=DOMAIN_PATH.read_text())
    return _UP


def up_problem(instance: dict):
    """The instance as a unified-planning Problem (memoized in-process)."""
    key = (instance["seed"], instance["digest"])
    if key not in _PROBLEMS:
        up = _up()
        _PROBLEMS[key] = up["reader"].parse_problem_string(up["domain"], instance["pddl"])
    return _PROBLEMS[key]


def up_plan(problem, rows: np.ndarray):
    """Decode plan rows into a unified-planning SequentialPlan of the problem's actions and objects."""
    up = _up()
    actions = [problem.action(name) for name in ACTIONS]
    objects = {f"b{i}": problem.object(f"b{i}") for i in range(len(problem.all_objects))}
    steps = []
    for code, x, y in rows.tolist():
        args = (objects[f"b{x}"],) if code < 2 else (objects[f"b{x}"], objects[f"b{y}"])
        steps.append(up["ActionInstance"](actions[code], args))
    return up["SequentialPlan"](steps)


def validate(problem, plan) -> tuple[bool, object]:
    """unified-planning's sequential plan validator: (valid, its result)."""
    up = _up()
    with up["PlanValidator"](name="sequential_plan_validator") as validator:
        result = validator.validate(problem, plan)
    return result.status == up["VALID"], result


def reference(instance: dict) -> tuple[int, float]:
    """(cost, seconds) of the reference planner's plan (Fast Downward, optimal), memoized in-process."""
    key = (instance["seed"], instance["digest"])
    if key not in _REFERENCE:
        up = _up()
        problem = up_problem(instance)
        start = time.perf_counter()
        with up["OneshotPlanner"](name=REFERENCE_PLANNER) as planner:
            result = planner.solve(problem)
        seconds = time.perf_counter() - start
        if result.plan is None:
            raise RuntimeError(f"reference planner found no plan for seed {instance['seed']}: {result.status}")
        _REFERENCE[key] = (len(result.plan.actions), seconds)
    return _REFERENCE[key]


# --- the domain's semantics, for the diagnostics ----------------------------------------------------------

def fact_words(block: int, support: int) -> str:
    return f"ontable(b{block})" if support == -1 else f"on(b{block}, b{support})"


def action_text(code: int, x: int, y: int) -> str:
    return f"{ACTIONS[code]}(b{x})" if code < 2 else f"{ACTIONS[code]}(b{x}, b{y})"


def simulate(init, rows: np.ndarray) -> tuple[list[int], int, list[str]]:
    """Run the plan with the domain's semantics. Returns (final on-array, 1-based failing step or 0, the
    failing step's unmet preconditions in words). ``on[i] == -3`` means block i is held."""
    on = [int(s) for s in init]
    n = len(on)
    held = -1
    for step, (code, x, y) in enumerate(rows.tolist(), start=1):
        clear = [True] * n
        for s in on:
            if s >= 0:
                clear[s] = False
        unmet = []
        if code == 0:    # pick-up x: clear(x), ontable(x), handempty
            unmet += [f"clear(b{x})"] * (not clear[x] or on[x] == -3) + [f"ontable(b{x})"] * (on[x] != -1)
            unmet += ["handempty"] * (held >= 0)
        elif code == 1:  # put-down x: holding(x)
            unmet += [f"holding(b{x})"] * (held != x)
        elif code == 2:  # stack x y: holding(x), clear(y)
            unmet += [f"holding(b{x})"] * (held != x) + [f"clear(b{y})"] * (not clear[y] or on[y] == -3)
        else:            # unstack x y: on(x, y), clear(x), handempty
            unmet += [f"on(b{x}, b{y})"] * (on[x] != y) + [f"clear(b{x})"] * (not clear[x] or on[x] == -3)
            unmet += ["handempty"] * (held >= 0)
        if unmet:
            return on, step, unmet
        if code in (0, 3):
            on[x], held = -3, x
        else:
            on[x], held = (-1 if code == 1 else y), -1
    return on, 0, []


def check_plan(answer, n: int) -> np.ndarray:
    """The candidate's answer as an int64 array (k, 3), or CandidateError."""
    if isinstance(answer, list | tuple):
        try:
            answer = np.asarray(answer)
        except ValueError as exc:
            raise CandidateError(f"plan() must return an int array (k, 3): {exc}") from None
    if not isinstance(answer, np.ndarray):
        raise CandidateError(f"plan() must return an int array (k, 3), got {type(answer).__name__}")
    if answer.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if answer.ndim != 2 or answer.shape[1] != 3:
        raise CandidateError(f"plan() must return an int array of shape (k, 3), got shape {answer.shape}")
    if not np.issubdtype(answer.dtype, np.integer):
        raise CandidateError(f"plan() must return integers, got dtype {answer.dtype}")
    if len(answer) > max_steps(n):
        raise CandidateError(f"plan has {len(answer)} steps, more than the {max_steps(n)} allowed for {n} blocks")
    rows = answer.astype(np.int64)
    code, x, y = rows[:, 0], rows[:, 1], rows[:, 2]
    unary = code < 2
    bad = (code < 0) | (code > 3) | (x < 0) | (x >= n) | np.where(unary, y != -1, (y < 0) | (y >= n))
    if bad.any():
        k = int(np.argmax(bad))
        raise CandidateError(f"plan row {k} = {rows[k].tolist()} is out of range: action 0..3, x 0..{n - 1}, "
                             f"y 0..{n - 1} for stack/unstack and -1 for pick-up/put-down")
    return rows


def evaluate(instance: dict, policy) -> dict:
    n = instance["n"]
    start = time.perf_counter()
    answer = policy.plan(np.array(instance["init"], dtype=np.int64), np.array(instance["goal"], dtype=np.int64))
    policy_time = time.perf_counter() - start
    rows = check_plan(answer, n)
    problem = up_problem(instance)
    valid, result = validate(problem, up_plan(problem, rows))
    final, failed, unmet = simulate(instance["init"], rows)
    diagnostics = {"plan_length": float(len(rows)), "valid": float(valid), "failed_step": float(failed),
                   "policy_time_s": policy_time}
    if failed:   # inapplicable: our simulation and unified-planning's validator must agree on where
        inapplicable = getattr(result, "inapplicable_action", None)
        code, x, y = rows[failed - 1].tolist()
        if valid or str(inapplicable) != action_text(code, x, y):
            raise RuntimeError(f"seed {instance['seed']}: unified-planning says {result.status} at {inapplicable}, "
                               f"the simulation fails step {failed} {action_text(code, x, y)}")
        text = f"step {failed} {action_text(code, x, y)}: " + ", ".join(f"{p} is false" for p in unmet)
        return {"score": 0.0, "success": False, "failure": "invalid plan", "text": text[:500],
                "diagnostics": diagnostics}
    false = [fact_words(i, s) for i, s in goal_facts(instance["goal"]) if final[i] != s]
    diagnostics["goal_facts_false"] = float(len(false))
    if valid != (not false):
        raise RuntimeError(f"seed {instance['seed']}: unified-planning says {result.status}, the simulation leaves "
                           f"{len(false)} goal facts false")
    if false:
        text = f"goal not reached after {len(rows)} steps: " + ", ".join(f"{f} is false" for f in false)
        return {"score": 0.0, "success": False, "failure": "goal not reached", "text": text[:500],
                "diagnostics": diagnostics}
    cost, seconds = reference(instance)
    diagnostics.update(reference_cost=float(cost), cost_ratio=len(rows) / cost, reference_time_s=seconds)
    return {"score": cost / len(rows), "success": True, "diagnostics": diagnostics}
