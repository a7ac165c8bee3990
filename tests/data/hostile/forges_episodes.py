"""Hostile: walks up its stack to the worker's job, then writes a well-formed JSON reply with a wrong
value on the worker's socket to the parent (length-prefixed, as the worker would).

``mode`` 0: ``episode_return`` 10**4000; 1: ``error`` 12345; 2: ``length`` -10**18; 3: 15 MiB of
diagnostics; 4: a return of NaN with no error; 5: an extra key."""
import json
import os
import struct
import sys

PARAMETERS = {"mode": {"default": 0.0, "low": 0.0, "high": 5.0}}


def _socket_fds():
    for fd in range(3, 256):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                yield fd
        except OSError:
            pass


def _job():
    frame = sys._getframe()
    while frame is not None:
        if "job_id" in frame.f_locals and "seed" in frame.f_locals:
            return frame.f_locals["job_id"], frame.f_locals["seed"]
        frame = frame.f_back
    raise RuntimeError("no job on the stack")


def act(observation, params):
    mode = int(params["mode"])
    job_id, seed = _job()
    ep = {"seed": seed, "episode_return": 500.0, "length": 500, "terminated": False, "truncated": True,
          "success": True, "error": None, "diagnostics": {"cause": "truncated"}}
    if mode == 0:
        ep["episode_return"] = 10**4000
    elif mode == 1:
        ep["error"] = 12345
    elif mode == 2:
        ep["length"] = -10**18
    elif mode == 3:
        ep["diagnostics"] = {"cause": "truncated", "final_observation": [0.5] * (15 * 2**20 // 5)}
    elif mode == 4:
        ep["episode_return"] = float("nan")
    else:
        ep["promoted"] = True
    body = json.dumps([job_id, ep]).encode()
    for fd in _socket_fds():
        os.write(fd, struct.pack("!i", len(body)) + body)
    return 0
