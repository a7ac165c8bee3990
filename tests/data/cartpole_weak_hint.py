"""A CartPole policy that plays a hashed coin flip, right a little more often as ``a`` grows above 0: short
episodes (about 10-50 env steps under a 500-step time limit) and a small, real gain to find."""

import math

PARAMETERS = {
    "a": {"default": 0.0, "low": -1.0, "high": 1.0},
    "b": {"default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    x = math.sin(observation[0] * 12345.678 + observation[3] * 9876.5 + params["b"] * 333.3) * 43758.5453
    u = x - math.floor(x)
    p_correct = 0.5 + 0.06 * max(0.0, params["a"])   # a > 0 helps a little
    correct = int(observation[2] + 0.5 * observation[3] > 0)
    return correct if u < p_correct else 1 - correct
