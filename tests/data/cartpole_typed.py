"""CartPole policy with an int and a categorical parameter (test fixture): ``range`` needs a Python int and the
choice indexes a dict, so an episode given anything else fails."""
PARAMETERS = {
    "w_angle": {"default": 0.5, "low": -1.0, "high": 1.0},
    "w_angular_velocity": {"default": 0.5, "low": -1.0, "high": 1.0},
    "horizon": {"type": "int", "default": 1, "low": 0, "high": 6},
    "rule": {"type": "categorical", "choices": ["angle", "both", "velocity"], "default": "both"},
}


def act(observation, params):
    angle, velocity = observation[2], observation[3]
    for _ in range(params["horizon"]):  # look ahead
        angle = angle + 0.02 * velocity
    terms = {"angle": params["w_angle"] * angle, "velocity": params["w_angular_velocity"] * velocity}
    z = terms["angle"] + terms["velocity"] if params["rule"] == "both" else terms[params["rule"]]
    return 1 if z > 0 else 0
