"""Random player: a uniformly drawn legal move (seeded by the episode, so games replay exactly)."""

import numpy as np

PARAMETERS = {}


def act(observation, params):
    legal = np.flatnonzero(observation["action_mask"])
    return int(np.random.choice(legal))
