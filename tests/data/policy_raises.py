"""Raises inside act() on the third step (test fixture)."""
PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}
_steps = [0]


def reset(params, seed):
    _steps[0] = 0


def act(observation, params):
    _steps[0] += 1
    if _steps[0] >= 3:
        raise ZeroDivisionError("policy bug on purpose")
    return 0
