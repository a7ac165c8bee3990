"""ratchet.advice: a run that promoted little says why, in numbers, and what to change."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import DATA

from ratchet.advice import parameters_at_bounds, run_advice


def _state(notes, gates=(), promotions=(), params=None, stop_reason="env-step budget used"):
    source = (DATA / "cartpole_linear.py").read_text()
    cands = {"base": {"params": {"w_position": 0.0, "w_velocity": 0.0, "w_angle": 0.0, "w_angular_velocity": 0.0}}}
    if params is not None:
        cands["inc"] = {"params": params}
    return SimpleNamespace(
        generation_log=[{"generation": i + 1, "gated": note is None, "gate_note": note} for i, note in enumerate(notes)],
        spec={"gate": {"validation_episodes": 8, "max_share": 0.3}, "refiner": {"sigma0": 0.2}},
        promotions=list(promotions), gates=list(gates), policy_source=source, baseline_id="base",
        incumbent_id="inc" if params is not None else "base", candidates=cands, stop_reason=stop_reason,
        cost_unit="env steps")


def test_names_the_causes_in_numbers():
    notes = ["not better on training seeds (paired mean difference -1.00)"] * 6 + \
            ["validation would take 40 % of env steps, over [gate] max_share = 0.3; it waits"] * 2 + [None, None]
    gates = [{"promoted": False, "mean_diff": 20.5}, {"promoted": False, "mean_diff": 24.0}]
    lines = run_advice(_state(notes, gates))
    text = "\n".join(lines)
    assert "0 promotion(s) in 10 generation(s): in 6 the best contender did not beat the incumbent" in text
    assert "sigma0 (now 0.2)" in text
    assert "2 generation(s) skipped the gate because validation would exceed [gate] max_share = 0.3" in text
    assert "2 gated candidate(s) were rejected, 2 of them with a positive mean gain (+20.5 to +24)" in text
    assert "validation_episodes (now 8)" in text
    assert '[refiner] restarts = "rescue" starts CMA-ES again at the start' in text  # nothing was promoted
    once = "\n".join(run_advice(_state(notes, gates, promotions=[{}])))
    assert "did not beat the incumbent" in once and "rescue" not in once  # a search that beat the start once


def test_the_share_is_said_in_what_the_budget_counts():
    """An evaluator task's budget counts instances, not env steps (regression: "of the env steps" everywhere)."""
    from pathlib import Path

    from ratchet.ledger.projection import RunState
    from ratchet.tasks.evaluator import EvaluatorTask

    notes = ["validation would take 40 % of instances, over [gate] max_share = 0.3; it waits"] * 2
    state = _state(notes)
    assert "max_share = 0.3 of the env steps;" in "\n".join(run_advice(state))
    evaluator = Path(__file__).resolve().parents[1] / "examples" / "blocksworld" / "evaluate.py"
    state.cost_unit = RunState(task=EvaluatorTask.from_file(evaluator).to_dict()).cost_unit  # as the run recorded it
    assert "max_share = 0.3 of the instances;" in "\n".join(run_advice(state))


def test_quiet_when_the_run_promoted_often():
    notes = [None] * 10
    assert run_advice(_state(notes, promotions=[{}] * 5)) == []


def test_parameters_at_a_bound_are_named():
    st = _state([None], params={"w_position": 0.1, "w_velocity": 1.0, "w_angle": -1.0, "w_angular_velocity": 0.5})
    lines = parameters_at_bounds(st)
    assert len(lines) == 2
    assert "w_velocity = 1 sits at its upper bound 1" in lines[0] and "widen its range" in lines[0]
    assert "w_angle = -1 sits at its lower bound -1" in lines[1]


# new-user pass: "w_angle = -1 sits at its lower bound -1: the search wanted to go further" for a parameter the
# starting policy already had there and the search never moved
def test_a_parameter_at_its_bound_from_the_start_is_not_named():
    st = _state([None], params={"w_position": 0.1, "w_velocity": 1.0, "w_angle": -1.0, "w_angular_velocity": 0.5})
    st.candidates["base"]["params"]["w_angle"] = -1.0
    lines = parameters_at_bounds(st)
    assert len(lines) == 1 and "w_velocity = 1 sits at its upper bound 1" in lines[0]


def test_only_array_elements_moved_to_a_bound_are_counted():
    from ratchet.policy import parse_policy

    st = _state([None], params={"w": [1.0, -1.0, 0.5]})
    st.policy_source = ('PARAMETERS = {"w": {"shape": [3], "default": 0.0, "low": -1.0, "high": 1.0}}\n\n\n'
                        "def act(observation, params):\n    return 0\n")
    parse_policy(st.policy_source, "<policy>", functions=None)  # (a valid policy)
    st.candidates["base"]["params"] = {"w": [1.0, 0.0, 0.0]}
    (line,) = parameters_at_bounds(st)
    assert line.startswith("parameter w: 1 of 3 elements sit at a bound (1 lower, 0 upper): the search wanted")


# regression (issue 18 §6): the same run was told both "lower [gate] validation_episodes (now 200)" (gates skipped
# for their cost) and "raise [gate] validation_episodes (now 200)" (gains the test could not certify), and one gain
# was given as the range "+1.63 to +1.63"
def test_advice_never_says_both_lower_and_raise_validation_episodes():
    notes = ["validation would take 40 % of env steps, over [gate] max_share = 0.3; it waits"] * 6 + \
            ["the budget cannot pay for validation (…)"] * 2 + [None, None]
    gates = [{"promoted": False, "mean_diff": 1.631}, {"promoted": False, "mean_diff": 1.629}]
    text = "\n".join(run_advice(_state(notes, gates)))
    assert "raise [gate] validation_episodes (now 8)" in text
    assert "lower [gate] validation_episodes" not in text
    assert "raise max_share or the budget" in text and "could not pay for a validation; raise the budget" in text
    assert "positive mean gain (+1.63) the test" in text and "+1.63 to +1.63" not in text
    # without underpowered rejections, fewer validation seeds is still the advice for gates skipped for cost
    alone = "\n".join(run_advice(_state(notes)))
    assert "raise max_share or lower [gate] validation_episodes (now 8)" in alone
    assert "raise the budget or lower [gate] validation_episodes (now 8)" in alone


# a run that reached its [budget] target promoted enough: `ratchet run` of examples/cartpole (one promotion in six
# generations, then the target) ended with "why so few promotions" advice
def test_quiet_about_promotions_when_the_run_reached_its_target():
    notes = ["validation would take 75 % of env steps, over [gate] max_share = 0.5; it waits"] * 5 + [None]
    assert run_advice(_state(notes, promotions=[{}], stop_reason="target reached (incumbent validation mean 500.00 "
                                                                  "≥ 500)")) == []
    assert run_advice(_state(notes, promotions=[{}]))  # the same run stopped by its budget
