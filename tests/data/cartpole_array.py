"""Linear CartPole policy with one array parameter (tests): push right when w · observation > 0."""

PARAMETERS = {
    "w": {"shape": [4], "default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    return int(params["w"] @ observation > 0)
