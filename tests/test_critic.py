"""ratchet.critic: evaluation statistics and critiques."""

from __future__ import annotations

import math

import numpy as np

from ratchet.critic import Critic, Evaluation, evaluation_from_episodes
from ratchet.rollout import Episode
from ratchet.task import GymTask


def ep(seed, ret, length=None, success=None, error=None):
    length = int(ret) if length is None else length
    if error:
        return Episode.failed(seed, error, length=length, episode_return=ret)
    return Episode(seed, float(ret), length, True, False, success)


def test_statistics():
    e = Evaluation("c", "validation", (ep(1, 10, success=False), ep(2, 20, success=True), ep(3, 60, success=True)))
    assert e.seeds == [1, 2, 3]
    assert e.n == 3
    assert e.returns.dtype == np.float64 and list(e.returns) == [10.0, 20.0, 60.0]
    assert e.mean == 30.0
    assert math.isclose(e.std, float(np.std([10, 20, 60])))  # population std (ddof=0)
    assert math.isclose(e.success_rate, 2 / 3)
    assert e.n_errors == 0
    assert e.env_steps == 90
    assert e.summary() == {"mean": 30.0, "std": e.std, "n": 3, "success_rate": e.success_rate, "n_errors": 0,
                           "env_steps": 90}


def test_success_rate_none_without_threshold():
    e = evaluation_from_episodes("c", "test", [ep(1, 10), ep(2, 30)])
    assert e.success_rate is None
    assert e.summary()["success_rate"] is None


def test_errors_count_as_failures_and_keep_partial_steps():
    e = Evaluation("c", "train", (ep(1, 500, success=True), ep(2, 7, length=7, error="policy raised KeyError: 'x'"),
                                  ep(3, 0, length=0, error="timeout after 1 s on seed 3")))
    assert e.n_errors == 2
    assert math.isclose(e.success_rate, 1 / 3)
    assert e.env_steps == 507
    assert math.isclose(e.mean, 169.0)


# regression (was a bug): critic.py Evaluation.success_rate returns 0.0-based rates for a task with no success
# threshold as soon as one episode errors (Episode.failed sets success=False, and the None check requires every
# episode to be error-free), although the docstring says None when the task has no success
def test_success_rate_stays_none_without_threshold_even_with_errors():
    e = Evaluation("c", "train", (ep(1, 10), ep(2, 20), ep(3, 0, length=0, error="timeout")))
    assert e.success_rate is None


def test_empty_evaluation():
    e = Evaluation("c", "validation", ())
    assert e.n == 0 and math.isnan(e.mean) and math.isnan(e.std)
    assert e.success_rate is None and e.env_steps == 0 and e.n_errors == 0


def test_critique_without_incumbent():
    e = Evaluation("abc", "train", tuple(ep(s, r) for s, r in zip(range(8), [50, 10, 40, 5, 30, 20, 60, 70])))
    c = Critic().critique(e)
    assert c.candidate_id == "abc" and c.split == "train"
    assert c.worst_seeds == [(3, 5.0), (1, 10.0), (5, 20.0), (4, 30.0), (2, 40.0)]
    assert c.regressions == [] and c.errors == {}
    assert c.stats == e.summary()
    assert "Candidate abc on train (8 episodes)" in c.text
    assert "regressions" not in c.text


def test_critique_regressions_against_incumbent():
    inc = Evaluation("inc", "validation", (ep(1, 100), ep(2, 100), ep(3, 100), ep(4, 100)))
    cand = Evaluation("cand", "validation", (ep(1, 150), ep(2, 99), ep(3, 40), ep(4, 100), ep(9, 1)))
    c = Critic().critique(cand, inc)
    assert c.regressions == [(2, 99.0, 100.0), (3, 40.0, 100.0)]  # seed 9 has no incumbent episode
    assert "regressions against the compared policy: 2 of 5 seeds worse" in c.text
    tolerant = Critic(regression_tolerance=5.0).critique(cand, inc)
    assert tolerant.regressions == [(3, 40.0, 100.0)]


def test_critique_counts_errors():
    e = Evaluation("c", "train", (ep(1, 3, error="policy raised KeyError: 'gain'"),
                                  ep(2, 3, error="policy raised KeyError: 'gain'"),
                                  ep(3, 0, error="timeout after 2 s on seed 3"), ep(4, 10)))
    c = Critic().critique(e)
    assert c.errors == {"policy raised KeyError: 'gain'": 2, "timeout after 2 s on seed N": 1}
    assert "2× policy raised KeyError" in c.text


def test_one_failure_naming_different_seeds_is_one_failure_mode():
    # a candidate that timed out on one seed has its other episodes skipped, each error naming a seed: one mode
    e = Evaluation("c", "test", tuple(ep(s, 0, length=0, error=f"skipped: timeout after 3 s on seed {1217899928 + s % 3}")
                                      for s in range(6)) + (ep(9, 0, length=0, error="timeout after 3 s on seed 9"),))
    c = Critic().critique(e)
    assert [(m.label, m.count) for m in c.failure_modes] == [("error: skipped: timeout after 3 s on seed N", 6),
                                                             ("error: timeout after 3 s on seed N", 1)]
    assert c.errors == {"skipped: timeout after 3 s on seed N": 6, "timeout after 3 s on seed N": 1}
    assert "6× skipped: timeout after 3 s on seed N" in c.text
    from ratchet.tasks.evaluator import _diagnose as evaluator_mode
    from ratchet.tasks.game import _diagnose as game_mode
    assert {evaluator_mode(x)[0] for x in e.episodes[:6]} == {game_mode(x)[0] for x in e.episodes[:6]} \
        == {"error: skipped: timeout after 3 s on seed N"}


def test_a_task_without_success_says_so_instead_of_no_failures():
    """A policy that scores nothing on a task with no success threshold is not 'without failures': the
    critique says success is undefined and how to define it."""
    crit = Critic().critique(evaluation_from_episodes("c", "test", [ep(1, 0), ep(2, 0)]))
    assert not crit.failure_modes
    assert "success is undefined for this task" in crit.text and "[task] success_threshold" in crit.text


def _mountain_car_episodes():
    """What a new user saw on MountainCar-v0 (threshold -110): 23 of 100 reach the goal fast enough, 77 reach it
    too slowly, none time out."""
    task = GymTask("MountainCar-v0")
    eps = []
    for s in range(100):
        ret = -100.0 if s < 23 else -130.0 - s % 7
        eps.append(Episode(s, ret, int(-ret), True, False, task.is_success(ret, True, False),
                           diagnostics={"final_observation": [0.5 + 0.001 * s, 0.01 * (s % 5)]}))
    return task, eps


# regression (issue 18 §6): the success rate never said what success is, and the incumbent's "failure modes" were
# k-means clusters ("cluster 1", "cluster 2") of MountainCar episodes that all reached the goal, only slowly
def test_a_critique_says_what_success_is_and_names_slow_goals_as_such():
    task, eps = _mountain_car_episodes()
    crit = Critic.for_task(task).critique(Evaluation("c", "test", tuple(eps)))
    assert "- success rate 23.0 %" in crit.text
    assert "success: return ≥ -110 (MountainCar-v0's registered reward_threshold)" in crit.text
    assert "- endings: 100 terminated, 0 time-outs (truncated), 0 errored" in crit.text
    assert [m.label for m in crit.failure_modes] == ["reached the goal, return below the success threshold"]
    assert "cluster" not in crit.text
    own = Critic.for_task(GymTask("MountainCar-v0", success_threshold=-120)).critique(Evaluation("c", "test",
                                                                                               tuple(eps)))
    assert "success: return ≥ -120 ([task] success_threshold)" in own.text


# regression (issue 18 §6): without a diagnoser, time-outs and episodes that ended below the threshold were one
# pool of "failures" clustered on their final observation; they are apart now, whatever the env
def test_without_a_diagnoser_time_outs_are_apart_from_ends_below_the_threshold():
    eps = [Episode(s, -200.0, 200, False, True, False, diagnostics={"final_observation": [0.0, 0.0]})
           for s in range(4)]
    eps += [Episode(10 + s, -150.0, 150, True, False, False, diagnostics={"final_observation": [0.5, 0.0]})
            for s in range(3)]
    eps += [Episode(20 + s, -90.0, 90, True, False, True, diagnostics={"final_observation": [0.5, 0.0]})
            for s in range(3)]
    crit = Critic(success_rule="return ≥ -110 ([task] success_threshold)").critique(Evaluation("c", "test", tuple(eps)))
    modes = {m.label: m.count for m in crit.failure_modes}
    assert modes == {"time-out": 4, "ended below the success threshold": 3}
    assert "- endings: 6 terminated, 4 time-outs (truncated), 0 errored" in crit.text
    assert "failure modes (errored or unsuccessful episodes)" in crit.text
    last_step = Episode(30, -90.0, 200, True, True, False, diagnostics={"final_observation": [0.5, 0.0]})
    both = Critic().critique(Evaluation("c", "test", (*eps, last_step)))
    assert "- endings: 7 terminated, 5 time-outs (truncated; 1 of them also terminated, on the last step), " \
           "0 errored" in both.text  # the counts add up to more than the episodes: say why
    modes = {m.label: m.count for m in both.failure_modes}  # it ended by the env's rule on its last step: no time-out
    assert modes == {"time-out": 4, "ended below the success threshold": 4}


# issue 42: the critique's k-means ran with one OpenMP thread per core; on a busy 2-core machine the threads only
# spun (0.3 s a critique, 5 s of a 33 s run with every worker idle); the clustering now holds one thread, same labels
def test_failure_clusters_are_found_with_one_thread(monkeypatch):
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_info

    seen: list[int] = []
    fit_predict = KMeans.fit_predict

    def counted(self, *args, **kwargs):
        seen.extend(p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp")
        return fit_predict(self, *args, **kwargs)

    monkeypatch.setattr(KMeans, "fit_predict", counted)
    eps = [Episode(s, -150.0, 150, True, False, False,
                   diagnostics={"final_observation": [5.0 * (s % 2) + 0.01 * s, 0.0]}) for s in range(12)]
    crit = Critic(success_rule="return ≥ 0").critique(Evaluation("c", "test", tuple(eps)))
    assert sorted(m.count for m in crit.failure_modes) == [6, 6]  # two clusters, as before
    assert set(seen) <= {1}  # (no OpenMP runtime at all: nothing to limit)


def test_failure_modes_a_ledger_stored_one_per_seed_read_as_one():
    """A run recorded before errors were grouped without their seeds stored one mode per seed of one timeout; its
    projection (show, the report, the dashboard) reads them as one mode."""
    from ratchet.critic import merged_modes
    from ratchet.ledger.projection import _regrouped

    stored = [{"label": f"error: skipped: timeout after 3 s on seed {s}", "count": c, "share": c / 10,
               "mean_return": r, "example_seeds": [s + 1, s + 2], "description": ""}
              for s, c, r in ((1217899928, 1, 0.0), (5, 3, 4.0))] + [
              {"label": "pole fell", "count": 2, "share": 0.2, "mean_return": 9.0, "example_seeds": [7],
               "description": "x"}]
    assert merged_modes(stored) == [
        {"label": "error: skipped: timeout after 3 s on seed N", "count": 4, "share": 0.4, "mean_return": 3.0,
         "example_seeds": [1217899929, 1217899930, 6], "description": ""},
        stored[2]]
    assert _regrouped({"failure_modes": stored, "n": 10}) == {"failure_modes": merged_modes(stored), "n": 10}
    assert _regrouped(None) is None
