"""Uses Python's and NumPy's global RNGs; run_episode seeds them (test fixture)."""
import random

import numpy as np

PARAMETERS = {"eps": {"default": 0.5, "low": 0.0, "high": 1.0}}


def act(observation, params):
    if random.random() < params["eps"]:
        return int(np.random.randint(2))
    return int(observation[2] + observation[3] > 0)
