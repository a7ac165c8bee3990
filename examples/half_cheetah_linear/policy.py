"""A linear policy for HalfCheetah-v5 written with one array parameter.

``action = clip(W · observation, -1, 1)``: ``W`` has one row per action (the six joint torques) and one
column per observation entry (17: the body's height and angles, then its velocities). The shape is
written as ``["act", "obs"]``, so ratchet sizes ``W`` from the task's spaces (6 × 17 = 102 numbers)
and ``act`` gets it as a NumPy array; CMA-ES searches all 102 numbers at once. All weights start at 0:
no torque, the cheetah stands still (return ≈ 0). Linear policies are a strong baseline on MuJoCo
locomotion (Mania, Guy and Recht, "Simple random search provides a competitive approach to
reinforcement learning", 2018).
"""

import numpy as np

PARAMETERS = {
    "W": {"shape": ["act", "obs"], "default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    return np.clip(params["W"] @ np.asarray(observation, dtype=np.float64), -1.0, 1.0)
