"""Mixed parameter forms: dict, log scale, tuple shorthand, annotated assignment (test fixture)."""
PARAMETERS: dict = {
    "gain": {"default": 0.5, "low": 0.0, "high": 2.0},
    "rate": {"default": 1e-3, "low": 1e-5, "high": 1e-1, "scale": "log"},
    "offset": (-0.25, -1, 1),
}


def act(observation, params):
    return 0
