"""Linear threshold policy for CartPole-v1 (test fixture)."""
PARAMETERS = {
    "w_position": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_angle": {"default": 0.0, "low": -1.0, "high": 1.0},
    "w_angular_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    z = (params["w_position"] * observation[0] + params["w_velocity"] * observation[1]
         + params["w_angle"] * observation[2] + params["w_angular_velocity"] * observation[3])
    return 1 if z > 0 else 0
