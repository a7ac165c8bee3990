"""Array parameters end to end: declaration and validation (ratchet.policy), CMA-ES over the flattened
vector, workers giving policies ndarrays and the task's spaces (trusted and legacy modes), a run with
resume, replay and export."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import DATA, RecordingExecutor, SimulatedKill, make_spec_dir, read_events

from ratchet.errors import PolicyError
from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox
from ratchet.ledger.projection import project
from ratchet.policy import (
    MAX_PARAMETER_NUMBERS,
    Candidate,
    describe_value,
    export_source,
    load_policy,
    materialize,
    parse_policy,
)
from ratchet.refiners import CMAESRefiner
from ratchet.spec import load_spec
from ratchet.task import GymTask

SRC = '''
PARAMETERS = {
    "gain": {"default": 0.5, "low": 0.0, "high": 2.0},
    "W": {"shape": [3, 2], "default": 0.0, "low": -1.0, "high": [[1, 2], [3, 4], [5, 6]]},
    "b": {"shape": [2], "default": [0.1, 0.2], "low": 0.01, "high": 1.0, "scale": "log"},
}


def act(observation, params):
    return 0
'''


def _policy(spec: str) -> str:
    return f"PARAMETERS = {{{spec}}}\n\ndef act(observation, params):\n    return 0\n"


# -- declaration and validation --------------------------------------------------------------------

def test_array_parameter_is_declared_with_its_shape_and_broadcast_bounds():
    prog = parse_policy(SRC)
    gain, w, _b = prog.parameters
    assert (gain.shape, gain.size, gain.is_array) == ((), 1, False)
    assert (w.shape, w.size, w.is_array) == ((3, 2), 6, True)
    assert w.array("high").tolist() == [[1, 2], [3, 4], [5, 6]] and w.array("low").shape == (3, 2)
    assert prog.defaults == {"gain": 0.5, "W": ((0.0,) * 2,) * 3, "b": (0.1, 0.2)}


@pytest.mark.parametrize("spec, fragment", [
    ('"W": {"shape": [2, 0], "default": 0.0, "low": 0.0, "high": 1.0}', "shape must be a list of positive integers"),
    ('"W": {"shape": 3, "default": 0.0, "low": 0.0, "high": 1.0}', "shape must be a list of positive integers"),
    ('"W": {"shape": [2], "default": [0.0, 0.0, 0.0], "low": 0.0, "high": 1.0}', "default must be a number or a nested list of shape [2], got a list of shape [3]"),
    ('"W": {"shape": [2, 2], "default": [[0.0], [0.0, 0.0]], "low": 0.0, "high": 1.0}', "got a ragged list"),
    ('"W": {"shape": [2], "default": [0.0, float("nan")], "low": 0.0, "high": 1.0}', "PARAMETERS must be a literal"),
    ('"W": {"shape": [2], "default": [0.0, 1e999], "low": 0.0, "high": 1.0}', "every default must be a finite number"),
    ('"W": {"shape": [2], "default": 0.5, "low": [0.0, 1.0], "high": 1.0}', "low must be below high elementwise, not so at index [1]"),
    ('"W": {"shape": [2, 2], "default": [[0.5, 0.5], [0.5, 2.0]], "low": 0.0, "high": 1.0}', "default is outside its bounds at index [1, 1]"),
    ('"W": {"shape": [2], "default": 0.5, "low": [0.1, 0.0], "high": 1.0, "scale": "log"}', "needs low > 0 everywhere, not so at index [1]"),
    ('"W": {"shape": [2], "default": 0.0, "low": -1e308, "high": 1e308}', "the range high - low overflows"),
    ('"W": {"default": [0.0, 0.0], "low": 0.0, "high": 1.0}', 'add "shape": [2] to declare an array parameter'),
    ('"W": {"shape": [400, 400], "default": 0.0, "low": 0.0, "high": 1.0}', "holds 160,000 numbers"),
    (('"W": {"shape": [60000], "default": 0.0, "low": 0.0, "high": 1.0}, '
      '"V": {"shape": [60000], "default": 0.0, "low": 0.0, "high": 1.0}'), "at 'V'"),
])
def test_validation_errors_name_the_parameter_and_the_fix(spec, fragment):
    with pytest.raises(PolicyError) as info:
        parse_policy(_policy(spec))
    text = str(info.value)
    assert fragment in text and "\n" not in text
    assert "'W'" in text or "PARAMETERS must" in text or "'V'" in text


def test_the_size_bound_is_documented_as_a_constant():
    ok = parse_policy(_policy(f'"W": {{"shape": [{MAX_PARAMETER_NUMBERS}], "default": 0.0, "low": 0.0, "high": 1.0}}'))
    assert ok.parameters[0].size == MAX_PARAMETER_NUMBERS


# -- candidates ------------------------------------------------------------------------------------

def test_candidate_holds_arrays_as_nested_tuples_and_round_trips_through_json():
    prog = parse_policy(SRC)
    w = np.arange(6, dtype=float).reshape(3, 2) / 10
    cand = prog.candidate({"gain": 1, "W": w, "b": [0.5, 0.25]})
    assert cand.params["W"] == ((0.0, 0.1), (0.2, 0.3), (0.4, 0.5)) and isinstance(cand.params["gain"], float)
    d = json.loads(json.dumps(cand.to_dict()))
    assert d["params"]["W"] == [[0.0, 0.1], [0.2, 0.3], [0.4, 0.5]]
    assert Candidate.from_dict(d) == cand
    assert prog.candidate({"gain": 1, "W": w + 1e-12, "b": [0.5, 0.25]}).id != cand.id
    with pytest.raises(PolicyError, match="expected an array of shape \\[3, 2\\], got shape \\[6\\]"):
        prog.candidate({"gain": 1, "W": w.ravel(), "b": [0.5, 0.25]})


def test_scalar_candidate_ids_are_unchanged():
    # computed with ratchet before array parameters existed: existing ledgers must still resume
    cand = load_policy(DATA / "cartpole_linear.py").candidate({"w_position": 0.1, "w_velocity": 0.5, "w_angle": 1.0,
                                                               "w_angular_velocity": 0.5})
    assert cand.id == "a5498df0623f"


def test_materialize_gives_fresh_float64_arrays_of_the_declared_shape():
    cand = parse_policy(SRC).candidate()
    a, b = materialize(cand.params), materialize(cand.params)
    assert isinstance(a["W"], np.ndarray) and a["W"].shape == (3, 2) and a["W"].dtype == np.float64
    assert a["gain"] == 0.5 and isinstance(a["gain"], float)
    a["W"][0, 0] = 9.0
    assert b["W"][0, 0] == 0.0 and cand.params["W"][0][0] == 0.0


def test_describe_value_summarises_arrays():
    assert describe_value(0.25) == "0.25"
    assert describe_value([[3.0, 4.0], [0.0, 0.0]]) == "array [2, 2]: 3, 4, 0, 0"
    assert describe_value([[3.0, 4.0, 0.0, 0.0]] * 2) == "array [2, 4]: min 0, mean 1.75, max 4, norm 7.071"


# -- export ----------------------------------------------------------------------------------------

def test_export_writes_arrays_readably_and_reads_back_exactly():
    prog = parse_policy(SRC)
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (3, 2))
    cand = prog.candidate({"gain": 1 / 3, "W": w, "b": [0.5, 0.25]})
    out = export_source(SRC, cand.params)
    back = parse_policy(out)
    assert back.candidate().params == cand.params  # exact: repr of each float
    assert f'"W": {{"shape": [3, 2], "default": [\n        [{float(w[0, 0])!r}, {float(w[0, 1])!r}],\n' in out  # one row per line
    assert '"b": {"shape": [2], "default": [0.5, 0.25], "low": 0.01' in out
    with pytest.raises(PolicyError, match="expected an array of shape \\[3, 2\\]"):
        export_source(SRC, {"W": [1.0, 2.0]})
    # a second export over the multi-line literal works too
    assert parse_policy(export_source(out, prog.defaults)).defaults == prog.defaults


# -- CMA-ES ----------------------------------------------------------------------------------------

def test_cmaes_flatten_unflatten_round_trip_and_dimension():
    prog = parse_policy(SRC)
    ref = CMAESRefiner(prog, seed=1)
    assert ref.dimension == 1 + 6 + 2
    cand = prog.candidate({"gain": 1.5, "W": [[-1, 2], [0, 4], [5, 0.5]], "b": [0.5, 0.02]})
    x = ref.flatten(cand.params)
    assert len(x) == 9 and all(0 <= v <= 1 for v in x)
    assert x[1:3] == [0.0, 1.0]  # W[0] at its lower and upper bound, C order
    back = ref.unflatten(x)
    for k, v in cand.params.items():
        assert np.allclose(back[k], v, rtol=1e-12, atol=0)
    assert np.shape(back["W"]) == (3, 2)


def test_cmaes_proposes_array_candidates_within_bounds():
    prog = parse_policy(SRC)
    ref = CMAESRefiner(prog, sigma0=0.5, seed=3)
    cands = ref.propose(prog.candidate(), None, np.random.default_rng(0))
    assert len(cands) == ref.population_size == 4 + int(3 * np.log(9))
    for c in cands:
        w = np.asarray(c.params["W"])
        assert w.shape == (3, 2) and np.all(w >= -1) and np.all(w <= prog.parameters[1].array("high"))
        assert np.all(np.asarray(c.params["b"]) >= 0.01)
    big = parse_policy(_policy('"W": {"shape": [1001], "default": 0.0, "low": -1.0, "high": 1.0}'))
    ref = CMAESRefiner(big, seed=0)
    assert len(ref.propose(big.candidate(), None, np.random.default_rng(0))) == ref.population_size
    assert ref._es.opts["CMA_diagonal"] is True  # sep-CMA-ES above FULL_COVARIANCE_MAX


# -- workers: ndarrays and spaces in both modes ----------------------------------------------------

@pytest.mark.parametrize("trusted", [True, False])
def test_policy_sees_ndarrays_and_the_task_spaces(trusted):
    cand = load_policy(DATA / "spaces_probe.py").candidate()
    with ProcessExecutor(workers=1, episode_timeout_s=60, sandbox=Sandbox(trusted_rollouts=trusted)) as ex:
        (ep,) = ex.run(GymTask("CartPole-v1"), [Job(cand, 5)])
    assert "obs (4,) act 2 W ndarray (4, 2) float64 sum 4.0 gain float" in ep.error, ep.error


# -- a run: resume, replay, export -----------------------------------------------------------------

def test_run_with_an_array_policy_resumes_replays_and_exports(tmp_path):
    from typer.testing import CliRunner

    from ratchet.cli import app
    from ratchet.loop import resume_run, start_run

    # the policy sizes w by the task ("obs"): start and resume both resolve it from the env
    spec_dir = make_spec_dir(tmp_path / "spec", policy="cartpole_array.py", budget={"env_steps": 10000}, refiner={"popsize": 4, "train_episodes": 2},
                             gate={"validation_episodes": 5}, test={"episodes": 5}, execution={"workers": 1})
    spec = load_spec(spec_dir)
    runs = tmp_path / "runs"
    with pytest.raises(SimulatedKill):
        start_run(spec, runs, "arr", executor=RecordingExecutor(ProcessExecutor(workers=1), die_after=12))
    result = resume_run("arr", runs, executor=ProcessExecutor(workers=1))
    st = project(read_events(runs / "arr"))
    assert st.status == "finished"
    inc = result.incumbent
    assert np.shape(inc.params["w"]) == (4,) and isinstance(inc.params["w"], tuple)
    assert len(st.candidates) > 2

    runner = CliRunner()
    out = tmp_path / "refined.py"
    res = runner.invoke(app, ["export", str(runs / "arr"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert load_policy(out, dims={"obs": 4, "act": 2}).candidate().params == inc.params
    seed = next(e for e in st.evaluations if e["candidate_id"] == inc.id and e["split"] == "test")["episodes"][0]["seed"]
    res = runner.invoke(app, ["replay", str(runs / "arr"), "--seed", str(seed)])
    assert res.exit_code == 0 and "match" in res.stdout, res.output
    res = runner.invoke(app, ["show", str(runs / "arr")])
    assert res.exit_code == 0 and "w array [4]: 0, 0, 0, 0" in res.stdout, res.output
    from ratchet.report.html import render_report

    html = render_report(st)
    table = html[html.index("<h2>Parameter changes"):html.index("<h2>Lineage")]
    assert "<td>w</td><td>array [4]: 0, 0, 0, 0</td>" in table and table.count("<tr>") < 5


# -- shapes sized by the task's spaces; the generic example ----------------------------------------

ROOT = DATA.parents[1]


def test_shapes_may_name_the_task_sizes():
    src = _policy('"K": {"shape": ["act", "obs"], "default": 0.0, "low": -1.0, "high": 1.0}')
    with pytest.raises(PolicyError, match="refers to the task's spaces"):
        parse_policy(src)
    prog = parse_policy(src, dims={"obs": 3, "act": 1})
    assert prog.parameters[0].shape == (1, 3)
    k = [[0.25, -0.5, 1.0]]
    out = export_source(src, {"K": k})  # export reads the sizes off the values
    assert parse_policy(out, dims={"obs": 3, "act": 1}).defaults["K"] == ((0.25, -0.5, 1.0),)


def test_docs_array_snippet_is_valid():
    import re

    page = (ROOT / "docs/how-to/policies/program.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if '"shape": [8, 2]' in b)
    prog = parse_policy(block + "\ndef act(observation, params):\n    return 0\n", dims={"obs": 4, "act": 2})
    assert [p.shape for p in prog.parameters] == [(8, 2), (2,), (2, 4)]


@pytest.mark.parametrize("trusted", [True, False])
def test_the_generic_example_runs_on_cartpole_unchanged(trusted):
    from ratchet.loop import load_program

    task = GymTask("CartPole-v1")
    prog = load_program(ROOT / "examples/linear_generic/policy.py", task)
    assert [p.shape for p in prog.parameters] == [(2, 4), (2,)]
    # push right when 0.1 x + 0.5 v + θ + 0.5 ω > 0 (the balancing weights), written for the rescaled observation
    w = [[0.0] * 4, [0.1 * 4.8, 0.5, 1.0 * 0.41887903, 0.5]]
    cand = prog.candidate({"W": w, "b": [0.0, 0.0]})
    with ProcessExecutor(workers=1, episode_timeout_s=60, sandbox=Sandbox(trusted_rollouts=trusted)) as ex:
        eps = ex.run(task, [Job(cand, s) for s in (1, 2)] + [Job(prog.candidate(), 1)])
    assert [e.error for e in eps] == [None] * 3
    assert min(e.length for e in eps[:2]) > 400 and eps[2].length < 20


def test_the_half_cheetah_example_is_one_array_parameter():
    """examples/half_cheetah_linear: W of shape ["act", "obs"] = (6, 17) on HalfCheetah-v5, exported one row
    per line. Needs MuJoCo (the optional extra)."""
    pytest.importorskip("mujoco", reason="needs MuJoCo for HalfCheetah-v5: pip install 'policy-ratchet[mujoco]'")
    from ratchet.loop import load_program

    spec = load_spec(ROOT / "examples/half_cheetah_linear")
    task = GymTask.from_spec(spec.task)
    prog = load_program(spec.policy_path, task)
    assert [(p.name, p.shape) for p in prog.parameters] == [("W", (6, 17))]
    w = np.random.default_rng(0).uniform(-0.3, 0.3, (6, 17))
    cand = prog.candidate({"W": w})
    with ProcessExecutor(workers=1, episode_timeout_s=120) as ex:
        eps = ex.run(task, [Job(prog.candidate(), 0), Job(cand, 0)])
    assert [e.error for e in eps] == [None, None] and [e.length for e in eps] == [1000, 1000]
    assert abs(eps[0].episode_return) < 5  # all zeros: no torque, the cheetah stands still
    text = export_source(prog.source, cand.params)
    assert sum(1 for line in text.splitlines() if line.strip().startswith("[") and line.count(",") == 17) == 6
    assert load_policy(ROOT / "examples/half_cheetah_linear/policy.py", dims={"obs": 17, "act": 6}).parameters[0].shape \
        == (6, 17)


def test_advice_counts_array_elements_at_their_bounds():
    from ratchet.advice import parameters_at_bounds
    from ratchet.ledger.projection import RunState

    src = (ROOT / "examples/linear_generic/policy.py").read_text(encoding="utf-8")  # shapes name "act", "obs"
    w = np.zeros((2, 4))
    w[0, 0], w[1, 2] = -5.0, 4.9999
    st = RunState(policy_source=src, baseline_id="a", incumbent_id="b",
                  candidates={"b": {"params": {"W": w.tolist(), "b": [0.0, 1.0]}}})
    assert parameters_at_bounds(st) == [
        ("parameter W: 2 of 8 elements sit at a bound (1 lower, 1 upper): the search wanted to go further; widen "
         "their range in PARAMETERS"),
        ("parameter b: 1 of 2 elements sit at a bound (0 lower, 1 upper): the search wanted to go further; widen "
         "their range in PARAMETERS")]
