"""Hostile: leaves files for the candidate after it on its worker, or looks for them.

``mode`` 0: writes ``PLANTED`` in its own folder, ``../PLANTED`` in the worker's folder and ``/dev/shm/PLANTED``
(where it can), and ``mb`` MiB more in files of 1 MiB each (``big-<k>``, so no one file meets the file-size
limit), then plays on. 1: raises ``RuntimeError("seen=[...]")`` naming the planted paths it finds, and what its
folder and the one above it hold."""
import os

PARAMETERS = {"mode": {"default": 0.0, "low": 0.0, "high": 1.0},
              "mb": {"default": 1.0, "low": 0.0, "high": 4096.0}}
PLACES = ("PLANTED", "../PLANTED", "/dev/shm/PLANTED", os.path.expanduser("~/PLANTED"))


def act(observation, params):
    if int(params["mode"]) == 1:
        seen = [p for p in PLACES if os.path.lexists(p)]
        raise RuntimeError(f"seen={seen} here={sorted(os.listdir('.'))} above={sorted(os.listdir('..'))}")
    if not os.path.exists("PLANTED"):
        for path in PLACES:
            try:
                with open(path, "w") as f:
                    f.write("for the next candidate")
            except OSError:
                pass
        block = b"x" * 2**20
        for k in range(int(params["mb"])):
            with open(f"big-{k}", "wb") as f:
                f.write(block)
    return 0
