"""Hostile: a bounded fork bomb (up to 2000 sleeping children, never reaped)."""
import os
import time

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    for _ in range(2000):
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
    return 0
