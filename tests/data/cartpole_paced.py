"""A linear CartPole controller that spends about 0.3 ms per step, so a run lasts long enough to be
disturbed (test fixture for fault injection)."""
import time

NAMES = ("w_position", "w_velocity", "w_angle", "w_angular_velocity")
PARAMETERS = {
    "w_position": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_angle": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_angular_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    time.sleep(0.0002)
    return int(sum(params[n] * x for n, x in zip(NAMES, observation)) > 0)
