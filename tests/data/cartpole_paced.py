"""A CartPole controller (linear in velocity, angle and angular velocity) that spends about 0.3 ms per
step, so a run lasts long enough to be disturbed (test fixture for fault injection)."""
import time

PARAMETERS = {"w_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},
              "w_angle": {"default": 0.0, "low": -1.0, "high": 1.0},
              "w_angular_velocity": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    time.sleep(0.0002)
    z = params["w_velocity"] * observation[1] + params["w_angle"] * observation[2]
    return int(z + params["w_angular_velocity"] * observation[3] > 0)
