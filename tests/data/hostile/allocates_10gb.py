"""Hostile: asks for 10 GB of memory at once."""
PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    hog = bytearray(10 * 2**30)
    return int(len(hog) > 0)
