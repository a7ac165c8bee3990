"""Top-level code raises when the worker compiles it (test fixture)."""
PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}

raise RuntimeError("broken at import")


def act(observation, params):
    return 0
