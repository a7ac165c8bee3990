"""Returns an action outside CartPole's Discrete(2) (test fixture)."""
PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    return 7
