"""Hostile: replaces its worker's log with something the driver must not follow, then dies.

``mode`` 0: a symlink to ``/tmp/ratchet-secret-<tag>`` (a root-only file); 1: a symlink to
``/proc/self/environ`` (read by the driver, that is the driver's environment); 2: a FIFO (an open or
read that never returns); 3: a symlink to ``/dev/zero`` (endless bytes); 4: a hard link to
``/tmp/ratchet-secret-<tag>`` (where the kernel allows one)."""
import os

PARAMETERS = {"mode": {"default": 0.0, "low": 0.0, "high": 3.0},
              "tag": {"default": 0.0, "low": 0.0, "high": 1e9}}


def act(observation, params):
    mode, secret = int(params["mode"]), f"/tmp/ratchet-secret-{int(params['tag'])}"
    here = os.getcwd()  # a candidate's own folder inside the worker's (trusted rollouts), or the worker's
    log = os.path.join(here if os.path.exists(os.path.join(here, "worker.log")) else os.path.dirname(here),
                       "worker.log")
    os.remove(log)
    if mode == 0:
        os.symlink(secret, log)
    elif mode == 1:
        os.symlink("/proc/self/environ", log)
    elif mode == 2:
        os.mkfifo(log)
    else:
        os.symlink("/dev/zero", log)
    os._exit(1)
