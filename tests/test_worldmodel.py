"""The world model: transitions recorded on the trusted side, the ensemble, imagined rollouts, the screen."""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest

from ratchet.tasks.gym import GymTask
from ratchet.worldmodel.imagine import action_encoder, imagined_returns
from ratchet.worldmodel.model import WorldModel, WorldModelError, fit_model
from ratchet.worldmodel.screen import ScreenState, choose, optimistic, rank_correlation
from ratchet.worldmodel.transitions import Transitions, TransitionsError, record_transitions


def _pendulum_policy(gain: float) -> types.SimpleNamespace:
    return types.SimpleNamespace(act=lambda obs, p: np.array([np.clip(-p["k"] * obs[2], -2, 2)], np.float32))


def _pendulum_data(tmp_path, episodes: int = 4, gain: float = 1.0) -> Transitions:
    task = GymTask("Pendulum-v1", max_episode_steps=50)
    data = Transitions.empty(3, 1)
    for seed in range(episodes):
        path = tmp_path / f"{seed}.transitions.npz"
        ep = record_transitions(task.make_env(), _pendulum_policy(gain), {"k": gain}, seed, task, str(path))
        got = Transitions.from_bytes(path.read_bytes())
        assert len(got) == ep.length == 50 and got.first[0] and not got.first[1:].any()
        assert got.truncated[-1] and not got.terminated.any()
        assert abs(float(got.reward.sum()) - ep.episode_return) < 1e-3
        data = data.joined(got)
    return data


def test_transitions_record_an_episode_as_it_ran_and_the_data_set_is_bounded(tmp_path):
    data = _pendulum_data(tmp_path, episodes=3)
    assert len(data) == 150 and len(data.starts()) == 3
    assert np.allclose(data.next_obs[:49], data.obs[1:50])  # consecutive steps of one episode
    kept = data.joined(data, limit=200)
    assert len(kept) == 200 and np.array_equal(kept.reward[-150:], data.reward)  # the newest rows are kept
    back = Transitions.from_bytes(kept.to_bytes())
    assert np.array_equal(back.obs, kept.obs) and np.array_equal(back.first, kept.first)


def test_transitions_of_a_discrete_action_are_one_hot(tmp_path):
    task = GymTask("CartPole-v1")
    path = tmp_path / "c.transitions.npz"
    record_transitions(task.make_env(), types.SimpleNamespace(act=lambda o, p: int(o[2] > 0)), {}, 3, task, str(path))
    data = Transitions.from_bytes(path.read_bytes())
    assert data.action.shape[1] == 2 and np.array_equal(data.action.sum(1), np.ones(len(data)))
    assert data.terminated[-1]


@pytest.mark.parametrize("bad", [b"not a zip", Transitions.empty(3, 1).to_bytes()[:-20]])
def test_transitions_refuse_bytes_they_did_not_write(bad):
    with pytest.raises(TransitionsError):
        Transitions.from_bytes(bad)


def test_transitions_refuse_non_finite_numbers_and_pickles(tmp_path):
    import io

    data = _pendulum_data(tmp_path, episodes=1)
    buf = io.BytesIO()
    arrays = {f: getattr(data, f) for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "first")}
    arrays["reward"] = arrays["reward"].copy()
    arrays["reward"][3] = np.nan
    np.savez(buf, **arrays)
    with pytest.raises(TransitionsError, match="finite"):
        Transitions.from_bytes(buf.getvalue())
    buf = io.BytesIO()
    np.savez(buf, **{**arrays, "reward": np.array([object()] * len(data), dtype=object)})
    with pytest.raises(TransitionsError):
        Transitions.from_bytes(buf.getvalue())


def test_the_model_is_deterministic_and_predicts_held_out_steps(tmp_path):
    data = _pendulum_data(tmp_path, episodes=6)
    model, fit = fit_model(data, members=3, hidden=32, updates=300, seed=1)
    again, fit2 = fit_model(data, members=3, hidden=32, updates=300, seed=1)
    assert model.to_bytes() == again.to_bytes() and fit == fit2
    assert fit.rows + fit.holdout == len(data) and fit.holdout_error < 0.3 and fit.disagreement > 0
    back = WorldModel.from_bytes(model.to_bytes())
    nxt, r, p = back.predict(data.obs[:5].astype(np.float64), data.action[:5].astype(np.float64), 2)
    assert nxt.shape == (5, 3) and r.shape == (5,) and p.shape == (5,)
    with pytest.raises(WorldModelError):
        WorldModel.from_bytes(data.to_bytes())


def test_imagined_returns_rank_pendulum_policies_as_real_episodes_do(tmp_path):
    data = Transitions.empty(3, 1)
    for gain in (0.0, 0.5, 1.0, 2.0):  # a spread of behaviour to learn from
        data = data.joined(_pendulum_data(tmp_path, episodes=2, gain=gain))
    model, _ = fit_model(data, members=3, hidden=32, updates=400, seed=0)
    env = gym.make("Pendulum-v1")
    gains = [0.0, 1.0, 2.0]
    act = _pendulum_policy(0).act
    imagined = imagined_returns(model, act, [{"k": g} for g in gains], data.starts()[:4], 50,
                                action_encoder(env.action_space))
    assert imagined.shape == (3, 3) and np.isfinite(imagined).all()
    task = GymTask("Pendulum-v1", max_episode_steps=50)
    real = []
    for g in gains:
        rets = [record_transitions(task.make_env(), _pendulum_policy(g), {"k": g}, s, task,
                                   str(tmp_path / "r.transitions.npz")).episode_return for s in range(4)]
        real.append(float(np.mean(rets)))
    rho = rank_correlation(optimistic(imagined, 0.0), real)
    assert rho is not None and rho > 0


def test_the_screen_keeps_the_best_with_optimism_and_switches_off_when_it_does_not_predict():
    returns = np.array([[1.0, 1.0], [0.0, 4.0], [3.0, 3.0]])  # means 1, 2, 3; the second is uncertain
    assert choose(optimistic(returns, 0.0), 2) == [2, 1]
    assert choose(optimistic(returns, 1.0), 1) == [1]  # 2 + 1 × 2 beats 3 + 0
    assert choose([1.0, float("nan"), 1.0], 3) == [0, 2, 1]
    assert rank_correlation([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert rank_correlation([1, 2], [1, 2]) is None and rank_correlation([1, 1, 1], [1, 2, 3]) is None
    state = ScreenState(min_correlation=0.2, window=2)
    assert state.judge(1, 0.9) and state.judge(2, None) and state.judge(3, -0.1)  # mean 0.4: still on
    assert not state.judge(4, -0.5) and state.switched_off_at == 4
    assert not state.judge(5, 1.0)  # off for the rest of the run
