"""Segfaults its worker process by reading address 0 (test fixture)."""
import ctypes

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    ctypes.string_at(0)
    return 0
