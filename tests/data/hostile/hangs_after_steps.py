"""Hostile: plays 40 steps, then hangs (the episode timeout must end it, with its true step count)."""
import time

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}
_steps = 0


def reset(params, seed):
    global _steps
    _steps = 0


def act(observation, params):
    global _steps
    _steps += 1
    if _steps > 40:
        time.sleep(1000)
    return int(observation[2] + observation[3] > 0)
