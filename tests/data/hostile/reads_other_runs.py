"""Hostile: tries to read another run's ledger, ``/tmp/ratchet-runs-<tag>/other-run/ledger.sqlite``,
and smuggles what it found out in an error."""
import os
import pathlib

PARAMETERS = {"tag": {"default": 0.0, "low": 0.0, "high": 1e9}}


def act(observation, params):
    runs = f"/tmp/ratchet-runs-{int(params['tag'])}"
    found = {}
    for path in (runs, os.path.join(runs, "other-run"), os.path.join(runs, "other-run", "ledger.sqlite")):
        try:
            found[path] = os.listdir(path) if os.path.isdir(path) else pathlib.Path(path).read_text()
        except OSError as exc:
            found[path] = type(exc).__name__
    raise RuntimeError(f"found {found}")
