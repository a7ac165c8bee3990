"""Failure diagnosers and the critic's failure modes, intervals and clustering."""

from __future__ import annotations

import numpy as np
import pytest

from ratchet.critic import Critic, Evaluation, is_failure
from ratchet.diagnosers import bipedal_walker, cartpole, diagnoser_for, lunar_lander, observation_names
from ratchet.execution import Job
from ratchet.policy import parse_policy
from ratchet.rollout import Episode
from ratchet.task import GymTask


def ep(seed, ret, *, term=True, trunc=False, success=False, obs=None, final=None, error=None):
    diag = {"cause": "error" if error else ("terminated" if term else "truncated"), "final_observation": obs}
    if final is not None:
        diag["final_reward"] = final
    return Episode(seed, ret, 100, term and not error, trunc and not error, success, error, diag)


def test_lunar_lander_labels_follow_the_env_rules():
    assert lunar_lander(ep(1, -150, obs=[0.1, 0, 0, 0, 0, 0, 0, 0], final=-100)) == ["crashed"]
    assert lunar_lander(ep(2, -150, obs=[1.02, 0.5, 0, 0, 0, 0, 0, 0], final=-100)) == ["flew out of bounds"]
    assert lunar_lander(ep(3, 120, term=False, trunc=True, obs=[0, 0.3, 0, 0, 0, 0, 0, 0])) == ["hovered until time-out"]
    assert lunar_lander(ep(4, 150, obs=[0.5, 0, 0, 0, 0, 0, 1, 1], final=100)) == ["landed off the pad"]
    assert lunar_lander(ep(5, 180, obs=[0.05, 0, 0, 0, 0, 0, 1, 1], final=100)) == ["landed, low score"]
    assert lunar_lander(ep(6, 0, error="policy raised ValueError: x")) == ["error"]


def test_cartpole_and_bipedal_labels():
    assert cartpole(ep(1, 30, obs=[2.5, 0, 0.01, 0])) == ["cart left the track"]
    assert cartpole(ep(2, 30, obs=[0.1, 0, 0.25, 0])) == ["pole fell"]
    assert bipedal_walker(ep(1, -110, obs=[0] * 24, final=-100)) == ["fell"]
    assert bipedal_walker(ep(2, -20, term=False, trunc=True, obs=[0, 0, 0.001] + [0] * 21)) == ["stalled"]
    assert bipedal_walker(ep(3, 150, term=False, trunc=True, obs=[0, 0, 0.2] + [0] * 21)) == ["time-out"]


def test_diagnoser_lookup_and_names():
    assert diagnoser_for("LunarLander-v3") is lunar_lander
    assert diagnoser_for("CartPole-v1") is cartpole
    assert diagnoser_for("Pendulum-v1") is None
    assert observation_names("CartPole-v1", 4)[2] == "pole_angle"
    assert observation_names("CartPole-v1", 5) == [f"obs[{i}]" for i in range(5)]


def test_cartpole_diagnoser_on_recorded_episodes(pool):
    """Real CartPole episodes: a policy that always pushes right loses the pole; a slow drift policy
    that balances but walks away leaves the track."""
    right = parse_policy("PARAMETERS = {}\ndef act(o, p):\n    return 1\n").candidate()
    drift = parse_policy("PARAMETERS = {}\ndef act(o, p):\n    return int(o[2] + 0.5 * o[3] + 0.02 > 0)\n").candidate()
    task = GymTask("CartPole-v1")
    eps = pool.run(task, [Job(right, s) for s in range(5)] + [Job(drift, s) for s in range(5)])
    assert {tuple(cartpole(e)) for e in eps[:5]} == {("pole fell",)}
    assert any(cartpole(e) == ["cart left the track"] for e in eps[5:]) or all(e.truncated for e in eps[5:])
    for e in eps:
        assert "final_reward" in e.diagnostics


def test_failure_modes_grouped_by_diagnoser_with_counts_and_examples():
    eps = [ep(i, -100 - i, obs=[0.1] + [0] * 7, final=-100) for i in range(6)]
    eps += [ep(10 + i, 150, obs=[0.5, 0, 0, 0, 0, 0, 1, 1], final=100) for i in range(3)]
    eps += [ep(20 + i, 250, success=True, obs=[0] * 8, final=100) for i in range(11)]
    crit = Critic(lunar_lander).critique(Evaluation("c", "test", tuple(eps)))
    modes = {m.label: m for m in crit.failure_modes}
    assert list(modes) == ["crashed", "landed off the pad"]
    assert modes["crashed"].count == 6 and modes["crashed"].share == pytest.approx(0.3)
    assert modes["crashed"].example_seeds == (5, 4, 3)  # lowest return first
    assert modes["landed off the pad"].mean_return == pytest.approx(150)
    assert "**crashed**: 6 episodes (30.0 %)" in crit.text


def test_clustering_separates_known_modes_and_names_the_feature():
    rng = np.random.default_rng(0)
    fails = [ep(i, -50, obs=[5.0 + rng.normal(0, 0.1), rng.normal(0, 0.1)]) for i in range(8)]
    fails += [ep(100 + i, -60, obs=[rng.normal(0, 0.1), -5.0 + rng.normal(0, 0.1)]) for i in range(8)]
    goods = [ep(200 + i, 10, success=True, obs=[rng.normal(0, 0.1), rng.normal(0, 0.1)]) for i in range(16)]
    crit = Critic(observation_names=["position", "velocity"]).critique(Evaluation("c", "test", tuple(fails + goods)))
    assert len(crit.failure_modes) == 2
    by_seed = {m.example_seeds[0] // 100: m for m in crit.failure_modes}
    assert by_seed[0].count == 8 and by_seed[1].count == 8
    assert by_seed[0].description.startswith("position high")
    assert by_seed[1].description.startswith("velocity low")


def test_errors_group_by_message_without_diagnoser():
    eps = [ep(i, 0, error="timeout after 1 s on seed") for i in range(3)] + [ep(9, 5, success=True, obs=[0.0])]
    modes = Critic().critique(Evaluation("c", "train", tuple(eps))).failure_modes
    assert len(modes) == 1 and modes[0].label.startswith("error: timeout") and modes[0].count == 3


def test_intervals_bootstrap_and_wilson():
    rng = np.random.default_rng(1)
    eps = [ep(i, float(r), success=bool(r > 0)) for i, r in enumerate(rng.normal(1.0, 1.0, 200))]
    crit = Critic().critique(Evaluation("c", "test", tuple(eps)))
    lo, hi = crit.mean_ci
    assert lo < crit.stats["mean"] < hi and 0.1 < hi - lo < 0.5
    slo, shi = crit.success_ci
    assert slo < crit.stats["success_rate"] < shi
    again = Critic().critique(Evaluation("c", "test", tuple(eps)))
    assert again.mean_ci == crit.mean_ci  # deterministic


def test_new_failures_against_incumbent():
    inc = Evaluation("i", "validation", (ep(1, 250, success=True), ep(2, 250, success=True)))
    cand = Evaluation("c", "validation", (ep(1, 100, success=False), ep(2, 260, success=True)))
    crit = Critic().critique(cand, inc)
    assert crit.new_failures == [1] and [r[0] for r in crit.regressions] == [1]
    assert is_failure(cand.episodes[0]) and not is_failure(cand.episodes[1])


# issue 18 §6: a MountainCar episode that reached the goal too slowly for the threshold is not a crash, nor one of
# "cluster 1" / "cluster 2"
def test_mountain_car_labels_say_whether_the_goal_was_reached():
    from ratchet.diagnosers import mountain_car

    assert diagnoser_for("MountainCar-v0") is mountain_car and diagnoser_for("MountainCarContinuous-v0") is mountain_car
    assert mountain_car(ep(1, -130, obs=[0.52, 0.01])) == ["reached the goal, return below the success threshold"]
    assert mountain_car(ep(2, -200, term=False, trunc=True, obs=[-0.5, 0.0])) == ["time-out before reaching the goal"]
    assert mountain_car(ep(3, 0, error="policy raised ValueError: x")) == ["error"]


def test_an_episode_that_ends_on_the_time_limits_last_step_is_named_by_how_the_task_ended():
    """Gymnasium sets terminated and truncated together when the task ends on the limit's last step: the task's
    own ending names it (a crash, the goal, the end of the course), never a time-out."""
    from ratchet.diagnosers import mountain_car

    last = {"term": True, "trunc": True}
    assert lunar_lander(ep(1, -150, **last, obs=[0.1, 0, 0, 0, 0, 0, 0, 0], final=-100)) == ["crashed"]
    assert cartpole(ep(2, 499, **last, obs=[0.1, 0, 0.25, 0])) == ["pole fell"]
    assert bipedal_walker(ep(3, 150, **last, obs=[0, 0, 0.001] + [0] * 21, final=0.3)) == ["reached the end, low score"]
    assert mountain_car(ep(4, -999, **last, obs=[0.52, 0.01])) == ["reached the goal, return below the success threshold"]
    assert Episode(5, 0.0, 10, True, True).timed_out is False and Episode(6, 0.0, 10, False, True).timed_out
