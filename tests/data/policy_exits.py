"""Kills its worker process with os._exit(3) (test fixture)."""
import os

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    os._exit(3)
