"""Hostile: writes 1 MB to stderr on each of its first 10 steps of every episode."""
import os

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}
_junk = b"x" * 2**20 + b"\n"
_steps = [0]


def reset(params, seed):
    _steps[0] = 0


def act(observation, params):
    _steps[0] += 1
    if _steps[0] <= 10:
        os.write(2, _junk)
    return 0
