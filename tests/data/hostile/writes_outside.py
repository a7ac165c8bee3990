"""Hostile: writes a file outside its working directory (/tmp/ratchet-escape-<tag>)."""
PARAMETERS = {"tag": {"default": 0.0, "low": 0.0, "high": 1e9}}


def act(observation, params):
    with open(f"/tmp/ratchet-escape-{int(params['tag'])}", "w") as f:
        f.write("escaped")
    return 0
