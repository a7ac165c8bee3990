"""Acrobot-v1: pump energy into the swing by torquing with the joints' motion.

Observation: cos θ1, sin θ1, cos θ2, sin θ2 (unitless), θ1' (rad/s, ±4π), θ2' (rad/s, ±9π).
Action: 0 (torque −1), 1 (0), 2 (+1). Return: −1 per step until the tip swings above the bar (≤ 500 steps).
"""

PARAMETERS = {
    "k1": {"default": 0.0, "low": -1.0, "high": 1.0},   # weight of θ1'
    "k2": {"default": 0.0, "low": -1.0, "high": 1.0},   # weight of θ2'
    "k3": {"default": 0.0, "low": -1.0, "high": 1.0},   # weight of sin θ2
}


def act(observation, params):
    """Torque in the direction of the weighted joint motion; 1 (no torque) when it is zero."""
    z = params["k1"] * observation[4] + params["k2"] * observation[5] + params["k3"] * observation[3]
    return 2 if z > 0 else 0 if z < 0 else 1
