"""A balancing CartPole controller that takes 4 ms per step, so an episode lasts about 2 s (test fixture)."""
import time

PARAMETERS = {"w_angle": {"default": 0.9, "low": -1.0, "high": 1.0},
              "w_angular_velocity": {"default": 0.6, "low": -1.0, "high": 1.0}}


def act(observation, params):
    time.sleep(0.004)
    return 1 if params["w_angle"] * observation[2] + params["w_angular_velocity"] * observation[3] > 0 else 0
