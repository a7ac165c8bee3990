"""Reports what the worker gave it (tests): the spaces it sees and the type, shape and dtype of its array
parameter, as the text of an exception raised on the first step."""

PARAMETERS = {
    "W": {"shape": [4, 2], "default": 0.5, "low": 0.0, "high": 1.0},
    "gain": {"default": 1.0, "low": 0.0, "high": 2.0},
}


def act(observation, params):
    w = params["W"]
    raise RuntimeError(f"obs {OBSERVATION_SPACE.shape} act {ACTION_SPACE.n} W {type(w).__name__} {w.shape} "  # noqa: F821
                       f"{w.dtype} sum {w.sum()} gain {type(params['gain']).__name__}")
