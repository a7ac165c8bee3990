"""Tabular policy for OpenSpiel's kuhn_poker: information state -> action probabilities (written by make_policy.py).

``probabilities`` is the softmax of the state's row of ``logits`` over its legal actions; ``act`` draws an action
from it. All logits 0 is the uniform random policy.
"""

import numpy as np

INFO_STATES = ['0', '0pb', '1', '1pb', '2', '2pb', '1p', '1b', '2p', '2b', '0p', '0b']
ROW = {s: i for i, s in enumerate(INFO_STATES)}

PARAMETERS = {"logits": {"shape": [12, 2], "default": 0.0, "low": -20.0, "high": 20.0}}


def probabilities(observation, params):
    logits = np.asarray(params["logits"][ROW[observation["info_state"]]], dtype=float)
    mask = np.asarray(observation["action_mask"], dtype=bool)
    z = np.where(mask, logits, -np.inf)
    p = np.exp(z - z[mask].max())
    return p / p.sum()


def act(observation, params):
    p = probabilities(observation, params)
    return int(np.random.choice(len(p), p=p))
