"""Linear threshold policy for CartPole-v1.

Push right (action 1) when ``w . obs > 0`` and left (action 0) otherwise, where
``obs = [cart position, cart velocity, pole angle, pole angular velocity]``.
All weights start at 0, which always pushes left and fails in about 10 steps;
a good weight vector (roughly: lean the cart toward where the pole falls)
balances the pole for all 500 steps.
"""

PARAMETERS = {
    "w_position": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_angle": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_angular_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    """Return 1 (push right) if the weighted sum is positive, else 0."""
    z = (
        params["w_position"] * observation[0]
        + params["w_velocity"] * observation[1]
        + params["w_angle"] * observation[2]
        + params["w_angular_velocity"] * observation[3]
    )
    return int(z > 0)
