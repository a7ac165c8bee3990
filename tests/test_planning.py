"""examples/blocksworld: the evaluator (generator, unified-planning validation, diagnostics) and its policy."""

import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("unified_planning")
pytest.importorskip("up_fast_downward")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "blocksworld"


def _load(name: str) -> types.ModuleType:
    """Load a file the way ratchet loads an evaluator: executed into a fresh module, not imported."""
    path = EXAMPLE / name
    module = types.ModuleType(f"blocksworld_{path.stem}")
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the project's own file
    return module


ev = _load("evaluate.py")
policy_module = _load("policy.py")
DEFAULTS = {k: v["default"] for k, v in policy_module.PARAMETERS.items()}


class Fixed:
    """A policy whose plan() returns a fixed answer."""

    def __init__(self, answer):
        self.answer = answer

    def plan(self, state, goal):
        return self.answer


class Local:
    """The example policy at given parameters, called in-process (ratchet calls it in the sandbox)."""

    def __init__(self, params):
        self.params = params

    def plan(self, state, goal):
        return policy_module.plan(state, goal, self.params)


# b1 on b0, b2 on the table; goal: b0 on b1 on b2; optimal: 4 actions
SUSSMAN = ev.instance(-1, [-1, 0, -1], [1, 2, -1])
SUSSMAN_PLAN = [(3, 1, 0), (2, 1, 2), (0, 0, -1), (2, 0, 1)]   # unstack b1 b0, stack b1 b2, pick-up b0, stack b0 b1


def test_generator_is_deterministic_and_held_out_problems_are_larger():
    assert ev.make_instance(7) == ev.make_instance(7)
    assert ev.make_instance(7)["pddl"] != ev.make_instance(10)["pddl"]
    sizes = {split: {ev.make_instance(3 * k + split)["n"] for k in range(60)} for split in (0, 1, 2)}
    assert sizes[0] <= set(range(4, 8)) and sizes[1] <= set(range(8, 11)) and sizes[2] <= set(range(8, 11))
    assert max(sizes[0]) < min(sizes[1] | sizes[2])
    for seed in range(12):   # never solved already; goals name only on/ontable facts of real blocks
        i = ev.make_instance(seed)
        assert any(i["init"][b] != s for b, s in ev.goal_facts(i["goal"]))
        assert all(-2 <= g < i["n"] and g != b for b, g in enumerate(i["goal"]))


def test_a_valid_plan_scores_its_cost_against_the_optimal_reference():
    r = ev.evaluate(SUSSMAN, Fixed(np.array(SUSSMAN_PLAN + [(3, 0, 1), (2, 0, 1)], dtype=np.int64)))
    assert r["success"] and r["diagnostics"]["valid"] == 1.0
    assert r["diagnostics"]["reference_cost"] == 4.0    # Fast Downward's optimal plan: 4 actions
    assert r["diagnostics"]["cost_ratio"] == pytest.approx(6 / 4) and r["score"] == pytest.approx(4 / 6)
    best = ev.evaluate(SUSSMAN, Fixed(np.array(SUSSMAN_PLAN)))
    assert best["score"] == 1.0 and best["diagnostics"]["plan_length"] == 4.0


def test_the_reference_planner_is_optimal_on_a_tiny_problem():
    # b2 on b1 on b0; goal: the reverse tower. Optimal: b2 to the table, b1 onto b2, b0 onto b1: 6 actions
    tower = ev.instance(-2, [-1, 0, 1], [1, 2, -1])
    cost, _ = ev.reference(tower)
    assert cost == 6


def test_an_invalid_plan_names_the_first_failing_step_and_its_unmet_preconditions():
    bad = np.array([(3, 1, 0), (2, 1, 1), (0, 0, -1)])   # stack b1 on itself: clear(b1) is false (it is held)
    r = ev.evaluate(SUSSMAN, Fixed(bad))
    assert r["failure"] == "invalid plan" and r["score"] == 0.0 and not r["success"]
    assert r["text"] == "step 2 stack(b1, b1): clear(b1) is false"
    assert r["diagnostics"]["failed_step"] == 2.0 and r["diagnostics"]["valid"] == 0.0
    r = ev.evaluate(SUSSMAN, Fixed(np.array([(0, 2, -1), (0, 0, -1)])))   # second pick-up with a full hand
    assert r["text"] == "step 2 pick-up(b0): clear(b0) is false, handempty is false"


def test_a_valid_plan_that_misses_the_goal_fails_with_the_false_goal_facts():
    r = ev.evaluate(SUSSMAN, Fixed(np.array([(3, 1, 0), (2, 1, 2)])))
    assert r["failure"] == "goal not reached" and r["score"] == 0.0
    assert r["text"] == "goal not reached after 2 steps: on(b0, b1) is false"
    assert r["diagnostics"]["goal_facts_false"] == 1.0


@pytest.mark.parametrize("answer", [
    np.zeros((2, 2), dtype=np.int64),               # wrong shape
    np.array([[0.0, 1.0, -1.0]]),                    # floats
    np.array([[4, 0, -1]]),                           # no action 4
    np.array([[2, 0, -1]]),                           # stack needs a second block
    np.array([[0, 3, -1]]),                           # no block b3
    np.zeros((ev.max_steps(3) + 1, 3), dtype=np.int64),   # too long
    7,
])
def test_a_malformed_answer_is_the_candidates_error(answer):
    from ratchet.tasks.evaluator import CandidateError

    assert ev.CandidateError is CandidateError
    with pytest.raises(CandidateError):
        ev.evaluate(SUSSMAN, Fixed(answer))


def test_the_start_policy_is_valid_and_its_plans_are_decoded_for_unified_planning():
    for seed in (0, 1, 2):
        i = ev.make_instance(seed)
        rows = ev.check_plan(policy_module.plan(np.array(i["init"]), np.array(i["goal"]), DEFAULTS), i["n"])
        valid, _ = ev.validate(ev.up_problem(i), ev.up_plan(ev.up_problem(i), rows))
        final, failed, _ = ev.simulate(i["init"], rows)
        assert valid and not failed and all(final[b] == s for b, s in ev.goal_facts(i["goal"]))
