"""Hostile: never returns from act() (busy loop)."""
PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    while True:
        pass
