"""Hostile: looks for a secret file in the usual home directories and smuggles it out in an error."""
import glob
import os

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    found = {}
    for path in glob.glob("/root/.ratchet-secret-*") + glob.glob("/home/*/.ratchet-secret-*"):
        try:
            with open(path) as f:
                found[path] = f.read()
        except OSError as exc:
            found[path] = type(exc).__name__
    raise RuntimeError(f"uid {os.getuid()} found {found}")
