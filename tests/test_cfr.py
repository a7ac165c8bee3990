"""The ``cfr`` refiner's solver (ratchet.refiners.cfr_solver) against OpenSpiel's, and its training job's line."""

from __future__ import annotations

import io

import numpy as np
import pytest

pyspiel = pytest.importorskip("pyspiel")

from open_spiel.python import policy as os_policy
from open_spiel.python.algorithms import cfr, discounted_cfr
from open_spiel.python.algorithms import exploitability as os_exploitability

from ratchet.refiners.cfr import train
from ratchet.refiners.cfr_solver import CFRState, GameTree, average_policy, exploitability, iterate

SOLVERS = {"cfr": cfr.CFRSolver, "cfr+": cfr.CFRPlusSolver, "dcfr": discounted_cfr.DCFRSolver}


@pytest.mark.parametrize(("game", "iterations", "algorithm"), [("kuhn_poker", 25, "cfr"), ("kuhn_poker", 25, "cfr+"),
                                                              ("kuhn_poker", 25, "dcfr"), ("leduc_poker", 2, "cfr+")])
def test_the_solver_gives_openspiels_iterates(game: str, iterations: int, algorithm: str) -> None:
    g = pyspiel.load_game(game)
    tree = GameTree.from_game(g)
    theirs, ours = SOLVERS[algorithm](g), CFRState.start(tree)
    for _ in range(iterations):
        theirs.evaluate_and_update_policy()
        iterate(tree, ours, algorithm, 1)  # type: ignore[arg-type]
        assert np.allclose(average_policy(tree, ours), theirs.average_policy().action_probability_array,
                           rtol=0, atol=1e-9)
        assert np.allclose(ours.current, theirs.current_policy().action_probability_array, rtol=0, atol=1e-9)
    mine = exploitability(tree, average_policy(tree, ours))
    assert abs(mine - os_exploitability.exploitability(g, theirs.average_policy())) < 1e-9


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker"])
def test_exploitability_is_openspiels_best_response(game: str) -> None:
    g = pyspiel.load_game(game)
    tree = GameTree.from_game(g)
    table = os_policy.TabularPolicy(g)
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(tree.shape[1]), size=tree.shape[0]) * tree.mask
    table.action_probability_array[:] = p / p.sum(axis=1, keepdims=True)
    ours = exploitability(tree, table.action_probability_array)
    assert abs(ours - os_exploitability.exploitability(g, table)) < 1e-12
    assert abs(exploitability(tree, tree.uniform()) - {"kuhn_poker": 0.458333, "leduc_poker": 2.373611}[game]) < 1e-6


def test_predictive_cfr_plus_converges_faster_than_cfr_plus_on_kuhn() -> None:
    tree = GameTree.from_game(pyspiel.load_game("kuhn_poker"))
    values = {}
    for algorithm in ("cfr+", "pcfr+", "dcfr"):
        state = iterate(tree, CFRState.start(tree), algorithm, 300)  # type: ignore[arg-type]
        values[algorithm] = exploitability(tree, average_policy(tree, state))
    assert values["pcfr+"] < values["cfr+"] < 1e-3 and values["dcfr"] < 1e-3
    with pytest.raises(ValueError, match="algorithm must be one of"):
        iterate(tree, CFRState.start(tree), "cfr++", 1)  # type: ignore[arg-type]


def test_a_simultaneous_game_is_refused() -> None:
    with pytest.raises(ValueError, match="sequential game"):
        GameTree.from_game(pyspiel.load_game("matrix_rps"))


def _logits(out) -> np.ndarray:
    return np.load(io.BytesIO(out.artifacts["logits"]), allow_pickle=False)["logits"]


@pytest.mark.parametrize("algorithm", ["cfr", "cfr+", "dcfr", "pcfr+"])
def test_jobs_continue_one_line_exactly_whatever_the_algorithm(algorithm: str) -> None:
    parent = {"params": {"logits": np.zeros((12, 2)).tolist()}, "artifacts": {}}
    settings = {"game": "kuhn_poker", "algorithm": algorithm, "checkpoint": "lower", "low": -20.0, "high": 20.0}
    (whole,), _ = train(None, parent, {**settings, "iterations": 10}, (), 120)
    (first,), _ = train(None, parent, {**settings, "iterations": 4}, (), 48)
    (second,), _ = train(None, {**parent, "artifacts": {"state": first.artifacts["state"]}},
                         {**settings, "iterations": 6}, (), 72)
    assert {**second.info, "iterations": 10} == whole.info and whole.info["iteration"] == 10
    assert np.array_equal(_logits(second), _logits(whole)) and second.artifacts["state"] == whole.artifacts["state"]


def test_the_lower_checkpoint_is_the_less_exploitable_of_the_average_and_the_current_iterate() -> None:
    tree = GameTree.from_game(pyspiel.load_game("kuhn_poker"))
    parent = {"params": {"logits": np.zeros((12, 2)).tolist()}, "artifacts": {}}
    settings = {"game": "kuhn_poker", "algorithm": "cfr+", "low": -20.0, "high": 20.0, "iterations": 30}
    found = {}
    for checkpoint in ("average", "current", "lower"):
        (out,), _ = train(None, parent, {**settings, "checkpoint": checkpoint}, (), 360)
        z = np.where(tree.mask, _logits(out), -np.inf)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        found[checkpoint] = exploitability(tree, p / p.sum(axis=1, keepdims=True))
        assert abs(out.info["exploitability"] - found[checkpoint]) < 1e-12  # the job measured what it proposes
    assert found["lower"] == min(found["average"], found["current"])
    assert found["average"] != found["current"]


def test_a_state_written_before_the_current_iterate_was_kept_still_continues() -> None:
    parent = {"params": {"logits": np.zeros((12, 2)).tolist()}, "artifacts": {}}
    settings = {"game": "kuhn_poker", "algorithm": "cfr+", "low": -20.0, "high": 20.0, "iterations": 3}
    (first,), _ = train(None, parent, settings, (), 36)
    with np.load(io.BytesIO(first.artifacts["state"]), allow_pickle=False) as z:
        old = io.BytesIO()
        np.savez(old, regret=z["regret"], policy=z["policy"], iteration=z["iteration"])  # OpenSpiel's solver's state
    (second,), _ = train(None, {**parent, "artifacts": {"state": old.getvalue()}}, settings, (), 36)
    (whole,), _ = train(None, parent, {**settings, "iterations": 6}, (), 72)
    assert np.allclose(_logits(second), _logits(whole))  # CFR+'s current iterate is regret matching of its regrets
