"""The circle packing example (examples/circle_packing, issue 43): the evaluator's own validity check, the policy's
deterministic construction, and a tiny run of the example as shipped (a deterministic task: exact decisions)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import read_events

HERE = Path(__file__).resolve().parent.parent / "examples" / "circle_packing"


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


evaluator = _load("circle_packing_example_evaluate", "evaluate.py")
policy = _load("circle_packing_example_policy", "policy.py")
DEFAULTS = {"centres": np.asarray(policy.PARAMETERS["centres"]["default"], dtype=np.float64)}


class _Answers:
    """The candidate as the evaluator sees it, answering ``pack`` with fixed circles."""

    def __init__(self, circles):
        self.circles = circles

    def pack(self, n):
        return self.circles


def test_the_evaluator_checks_validity_itself_and_scores_the_sum_of_radii():
    grid = np.array([[(i + 0.5) / 5, (j + 0.5) / 5, 0.1] for i in range(5) for j in range(5)] + [[0.2, 0.2, 0.0]])
    assert evaluator.evaluate(26, _Answers(grid))["score"] == pytest.approx(2.5)
    for change, why in [((0, 2, 0.11), "leaves the square"), ((25, 2, 0.05), "overlap"),
                        ((25, 2, -0.01), "negative radius")]:
        bad = grid.copy()
        bad[change[0], change[1]] = change[2]
        out = evaluator.evaluate(26, _Answers(bad))
        assert out["score"] == 0.0 and out["failure"] == "invalid packing" and why in out["text"]
    touching = grid.copy()
    touching[0, 2] += 0.5e-9  # within the tolerance of 1e-9
    assert evaluator.check(touching) is None
    from ratchet.tasks.evaluator import CandidateError

    with pytest.raises(CandidateError, match="shape"):
        evaluator.evaluate(26, _Answers(grid[:25]))


def test_the_policy_packs_validly_and_deterministically_from_its_starting_centres():
    first = policy.pack(26, DEFAULTS)
    assert evaluator.check(first) is None and first[:, 2].sum() == pytest.approx(2.5875, abs=1e-3)
    assert np.array_equal(first, policy.pack(26, DEFAULTS))  # the same centres, the same packing


def test_the_example_runs_with_exact_decisions_and_scores_each_candidate_once(tmp_path):
    from typer.testing import CliRunner

    from ratchet.cli import app

    runs = tmp_path / "runs"
    res = CliRunner().invoke(app, ["run", str(HERE), "--runs-dir", str(runs), "--run-id", "c", "--no-report",
                                   "--set", "budget.episodes=8", "--set", "refiners.0.popsize=2"])
    assert res.exit_code == 0, res.output
    events = read_events(runs / "c")
    evals = [e.payload for e in events if e.type.value == "episodes_evaluated"]
    assert all(ev["summary"]["n"] == 1 and ev["episodes"][0]["error"] is None for ev in evals)
    train = [ev["candidate_id"] for ev in evals if ev["split"] == "train"]
    assert train and len(train) == len(set(train))
    assert all(g["test"] == "exact" for g in (e.payload for e in events if e.type.value == "gate_decided"))
    show = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["show", "c", "--runs-dir", str(runs)])
    assert show.exit_code == 0 and "no statistics were needed" in " ".join(show.output.split()), show.output
