"""Hostile: a dagger expert that, when the sandboxed trainer compiles it, walks up its own stack frames to
the trainer process's answer stream and writes an answer of its own choosing, then exits before the real
answer is written. ``FORGE`` (set by the test that copies this file) picks the answer:

- ``"infinite-size"``: an artifact whose size is ``Infinity`` (was an OverflowError in the driver);
- ``"deep"``: ``"[" * 200000`` as the header (was a RecursionError);
- ``"no-dataset"``: the parent's valid weights but no ``dataset`` role (was a KeyError on every resume);
- ``"bad-round"``: the real round's answer with ``info["round"] = "zz"`` (was a TypeError in idle_reason);
- ``"bomb"``: the real round's answer with its data set replaced by 100 M deflated zeros (was 4 GB in show).
"""
import io
import json
import os
import struct
import sys

FORGE = "infinite-size"
PARAMETERS = {"w_angle": {"default": 1.0, "low": 0.0, "high": 5.0}}


def act(observation, params):
    o = observation
    return int(params["w_angle"] * o[2] + 0.5 * o[3] + 0.05 * o[0] + 0.2 * o[1] > 0)


def _send(out, header, body=b""):
    data = header if isinstance(header, bytes) else json.dumps(header).encode()
    out.write(struct.pack("!I", len(data)) + data + body)
    out.flush()
    os._exit(0)


def _forge():
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "_main":
        frame = frame.f_back
    if frame is None:  # not inside the trainer process
        return
    main = frame.f_locals
    out, parent = main["out"], main["parent"]
    weights = parent["artifacts"]["weights"]
    if FORGE == "infinite-size":
        _send(out, b'{"error": null, "outputs": [{"info": {}, "artifacts": {"weights": Infinity}}]}')
    if FORGE == "deep":
        _send(out, b"[" * 200000)
    if FORGE == "no-dataset":
        _send(out, {"error": None, "outputs": [{"info": {}, "artifacts": {"weights": len(weights)}}]}, weights)
    # the real round, run once more in here (this module is compiled again inside: FORGING stops the loop)
    sys.FORGING = True
    from ratchet.refiners import dagger
    from ratchet.task import GymTask

    outputs, _ = dagger.train(GymTask.from_dict(main["task_dict"]), parent, main["settings"], main["seeds"],
                              main["env_steps"])
    arts, info = dict(outputs[0].artifacts), dict(outputs[0].info)
    if FORGE == "bad-round":
        info["round"] = "zz"
    if FORGE == "bomb":
        import numpy as np

        buf = io.BytesIO()
        np.savez_compressed(buf, obs=np.zeros(100_000_000, np.uint8))
        arts["dataset"] = buf.getvalue()
    _send(out, {"error": None, "outputs": [{"info": info, "artifacts": {r: len(b) for r, b in arts.items()}}]},
          b"".join(arts.values()))


if not getattr(sys, "FORGING", False):
    _forge()
