"""A generic affine policy: one file for any environment with a Box observation space.

``z = W · x + b``, where ``x`` is the observation rescaled to [-1, 1] by its space's bounds (dimensions
with an infinite bound are left as they are). A Discrete action space takes ``argmax(z)``; a Box action
space takes ``tanh(z)`` mapped onto its ``[low, high]``. Nothing about the environment is written here:
the shapes ``["act", "obs"]`` are resolved from the task's spaces when ratchet loads the file, and
``OBSERVATION_SPACE`` / ``ACTION_SPACE`` are set by ratchet before the first ``act`` of each episode.
"""

import numpy as np

PARAMETERS = {
    "W": {"shape": ["act", "obs"], "default": 0.0, "low": -5.0, "high": 5.0},
    "b": {"shape": ["act"], "default": 0.0, "low": -1.0, "high": 1.0},
}


def _rescaled(observation):
    x = np.asarray(observation, dtype=np.float64).ravel()
    low = np.asarray(OBSERVATION_SPACE.low, dtype=np.float64).ravel()  # noqa: F821 - set by ratchet
    high = np.asarray(OBSERVATION_SPACE.high, dtype=np.float64).ravel()  # noqa: F821
    bounded = np.isfinite(low) & np.isfinite(high) & (high - low < 1e6)
    centre = np.where(bounded, (low + high) / 2, 0.0)
    half = np.where(bounded, (high - low) / 2, 1.0)
    return (x - centre) / half


def act(observation, params):
    z = params["W"] @ _rescaled(observation) + params["b"]
    space = ACTION_SPACE  # noqa: F821 - set by ratchet
    if hasattr(space, "n"):  # Discrete
        return int(space.start + np.argmax(z))
    u = (np.tanh(z) + 1.0) / 2.0
    return (space.low + u.reshape(space.shape) * (space.high - space.low)).astype(space.dtype)
