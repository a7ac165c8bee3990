"""Hangs forever inside act() (test fixture for episode timeouts)."""
import time

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    while True:
        time.sleep(1000)
