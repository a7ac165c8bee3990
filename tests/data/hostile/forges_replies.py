"""Hostile: writes its own messages on every socket and pipe it holds (the worker's socket to the
parent without trusted rollouts; its pipe to the env host with them).

``mode`` 0: a pickle whose loading would create /tmp/ratchet-pwned-<tag> (code run in the parent);
1: bytes that are no message at all; 2: a header announcing 2 GB; 3: a header, then nothing."""
import os
import pickle
import struct
import time

PARAMETERS = {"mode": {"default": 0.0, "low": 0.0, "high": 3.0},
              "tag": {"default": 0.0, "low": 0.0, "high": 1e9}}


class Pwn:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _socket_fds():
    for fd in range(3, 256):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(("socket:", "pipe:")):
                yield fd
        except OSError:
            pass


def act(observation, params):
    mode = int(params["mode"])
    if mode == 0:
        body = pickle.dumps((0, Pwn(f"/tmp/ratchet-pwned-{int(params['tag'])}")))
        message = struct.pack("!i", len(body)) + body
    elif mode == 1:
        message = struct.pack("!i", 20) + b"this is not a pickle"
    elif mode == 2:
        message = struct.pack("!i", 0x7FFFFFF0) + b"x" * 100
    else:
        message = struct.pack("!i", 1000) + b"{"
    for fd in _socket_fds():
        try:
            os.write(fd, message)
        except OSError:  # the read end of a pipe
            pass
    if mode == 3:
        time.sleep(1000)
    return 0
