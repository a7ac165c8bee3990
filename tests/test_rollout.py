"""ratchet.rollout: action checking and single in-process episodes (no worker processes here)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import GOOD_WEIGHTS, data_source
from gymnasium import spaces

from ratchet.policy import compile_policy
from ratchet.rollout import Episode, InvalidAction, check_action, run_episode
from ratchet.task import GymTask

DISCRETE = spaces.Discrete(3)
SHIFTED = spaces.Discrete(3, start=-1)
BOX = spaces.Box(low=np.array([-1.0, 0.0], dtype=np.float32), high=np.array([1.0, 2.0], dtype=np.float32))


# -- Discrete --------------------------------------------------------------------------------------

@pytest.mark.parametrize("action", [0, 2, np.int64(1), np.array(2), np.int32(0)])
def test_discrete_accepts_ints(action):
    out = check_action(action, DISCRETE, "error")
    assert type(out) is int and out == int(action)


def test_discrete_respects_start():
    assert check_action(-1, SHIFTED, "error") == -1
    with pytest.raises(InvalidAction, match=r"outside Discrete range \[-1, 1\]"):
        check_action(2, SHIFTED, "error")
    assert check_action(-5, SHIFTED, "clip") == -1


@pytest.mark.parametrize("action", [3, -1, 100])
def test_discrete_out_of_range_is_an_error(action):
    with pytest.raises(InvalidAction, match=r"outside Discrete range \[0, 2\]"):
        check_action(action, DISCRETE, "error")


@pytest.mark.parametrize("action, clipped", [(3, 2), (-1, 0), (100, 2), (1, 1)])
def test_discrete_clip_mode_clips(action, clipped):
    assert check_action(action, DISCRETE, "clip") == clipped


@pytest.mark.parametrize("action", [1.0, np.float64(1.0), 0.5, "1", None, [1], True, np.bool_(False)])
def test_discrete_rejects_non_ints(action):
    with pytest.raises(InvalidAction, match="expected an int action"):
        check_action(action, DISCRETE, "error")
    with pytest.raises(InvalidAction):  # clipping never turns a wrong type into an action
        check_action(action, DISCRETE, "clip")


@pytest.mark.parametrize("action", [float("nan"), np.float32("nan"), float("inf")])
def test_discrete_non_finite_is_an_error(action):
    with pytest.raises(InvalidAction, match="non-finite"):
        check_action(action, DISCRETE, "clip")


# -- Box -------------------------------------------------------------------------------------------

def test_box_ok_converted_to_space_dtype():
    out = check_action([0.5, 1.5], BOX, "error")
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (2,)
    np.testing.assert_array_equal(out, np.array([0.5, 1.5], dtype=np.float32))


def test_box_same_size_is_reshaped():
    box = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
    out = check_action(0.25, box, "error")
    assert out.shape == (1,) and out[0] == np.float32(0.25)


@pytest.mark.parametrize("action", [[0.5], [0.5, 1.0, 1.5], np.zeros((2, 2))])
def test_box_shape_mismatch(action):
    with pytest.raises(InvalidAction, match="expected action shape"):
        check_action(action, BOX, "clip")


def test_box_non_numeric():
    with pytest.raises(InvalidAction, match="numeric array"):
        check_action(["a", "b"], BOX, "error")


@pytest.mark.parametrize("mode", ["error", "clip"])
@pytest.mark.parametrize("action", [[float("nan"), 0.0], [0.0, float("inf")], [-float("inf"), 1.0]])
def test_box_non_finite_is_an_error_even_when_clipping(mode, action):
    with pytest.raises(InvalidAction, match="non-finite"):
        check_action(action, BOX, mode)


@pytest.mark.parametrize("action", [[1.5, 1.0], [0.0, -0.1], [0.0, 2.0001]])
def test_box_out_of_bounds_is_an_error(action):
    with pytest.raises(InvalidAction, match="outside bounds"):
        check_action(action, BOX, "error")


def test_box_clip_mode_clips():
    out = check_action([1.5, -3.0], BOX, "clip")
    np.testing.assert_array_equal(out, np.array([1.0, 0.0], dtype=np.float32))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(check_action([0.25, 1.0], BOX, "clip"), np.array([0.25, 1.0], dtype=np.float32))


def test_bounds_are_inclusive():
    np.testing.assert_array_equal(check_action([-1.0, 2.0], BOX, "error"), np.array([-1.0, 2.0], dtype=np.float32))


def test_other_spaces_use_contains():
    space = spaces.MultiBinary(3)
    assert check_action(np.array([0, 1, 1], dtype=np.int8), space, "error") is not None
    with pytest.raises(InvalidAction, match="not in"):
        check_action(np.array([0, 2, 1], dtype=np.int8), space, "error")


# -- run_episode in-process ------------------------------------------------------------------------

def _episode(policy_file: str, params: dict[str, float], seed: int, task: GymTask | None = None) -> Episode:
    task = task or GymTask("CartPole-v1")
    mod = compile_policy(data_source(policy_file))
    env = task.make_env()
    try:
        return run_episode(env, mod.act, getattr(mod, "reset", None), params, seed, task)
    finally:
        env.close()


def test_run_episode_truncated_vs_terminated():
    good = _episode("cartpole_linear.py", GOOD_WEIGHTS, seed=3)
    assert (good.episode_return, good.length, good.truncated, good.terminated) == (500.0, 500, True, False)
    assert good.success is True and good.error is None and good.diagnostics["cause"] == "truncated"
    zero = _episode("cartpole_linear.py", dict.fromkeys(GOOD_WEIGHTS, 0.0), seed=3)
    assert zero.terminated is True and zero.truncated is False and zero.length < 30
    assert zero.success is False and zero.diagnostics["cause"] == "terminated"
    assert len(zero.diagnostics["final_observation"]) == 4


def test_run_episode_max_episode_steps_override_truncates():
    ep = _episode("cartpole_linear.py", GOOD_WEIGHTS, seed=3, task=GymTask("CartPole-v1", max_episode_steps=37))
    assert (ep.length, ep.truncated, ep.terminated) == (37, True, False)


def test_run_episode_is_deterministic_with_global_rngs():
    a = _episode("policy_random.py", {"eps": 0.5}, seed=11)
    b = _episode("policy_random.py", {"eps": 0.5}, seed=11)
    assert a == b and a.diagnostics == b.diagnostics
    others = {_episode("policy_random.py", {"eps": 0.5}, seed=s).episode_return for s in range(12, 20)}
    assert len(others) > 1  # the seed matters


def test_run_episode_policy_exception_is_the_outcome():
    ep = _episode("policy_raises.py", {"w": 0.0}, seed=1)
    assert ep.error.startswith("policy raised ZeroDivisionError: policy bug on purpose")
    assert (ep.length, ep.episode_return, ep.terminated, ep.truncated, ep.success) == (2, 2.0, False, False, False)
    assert ep.diagnostics["cause"] == "error"


def test_run_episode_invalid_action_is_the_outcome():
    ep = _episode("policy_nan.py", {"w": 0.0}, seed=1)
    assert ep.error.startswith("invalid action: step 0:") and "non-finite" in ep.error
    clipped = _episode("policy_out_of_range.py", {"w": 0.0}, seed=1, task=GymTask("CartPole-v1", action_mode="clip"))
    assert clipped.error is None and clipped.terminated  # 7 clipped to 1: always push right


def test_episode_dict_roundtrip():
    ep = _episode("cartpole_linear.py", GOOD_WEIGHTS, seed=5, task=GymTask("CartPole-v1", max_episode_steps=20))
    back = Episode.from_dict(ep.to_dict())
    assert back == ep and back.diagnostics == ep.diagnostics
    failed = Episode.failed(9, "timeout", task=GymTask("CartPole-v1"))
    assert (failed.error, failed.success, failed.terminated, failed.truncated) == ("timeout", False, False, False)
    assert Episode.failed(9, "timeout").success is None  # no task: success undefined
    assert math.isfinite(failed.episode_return)
