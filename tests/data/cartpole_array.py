"""Linear CartPole policy with one array parameter sized by the task (tests): push right when w · observation > 0."""

PARAMETERS = {
    "w": {"shape": ["obs"], "default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    return int(params["w"] @ observation > 0)
