"""A null policy for CartPole-v1: its parameters change every episode's return but not the expected return.

Each action is one bit of a hash of (parameters, observation, step), so any parameter values give a
policy that acts like a fair coin: returns differ from candidate to candidate on the same seed, but
every candidate has the same expected return. A gate that promotes a candidate here has promoted
noise. Used by ``benchmarks/null_gate.py`` and the test suite.
"""
import hashlib
import struct

PARAMETERS = {
    "a": {"default": 0.0, "low": -1.0, "high": 1.0},
    "b": {"default": 0.0, "low": -1.0, "high": 1.0},
}

_step = 0


def reset(params, seed):
    """Start a new episode: the step counter is part of the hash."""
    global _step
    _step = 0


def act(observation, params):
    """Return 0 or 1, a pseudo-random bit of hash(params, observation, step)."""
    global _step
    key = struct.pack("<2d", params["a"], params["b"]) + observation.tobytes() + _step.to_bytes(4, "little")
    _step += 1
    return hashlib.blake2b(key, digest_size=1).digest()[0] & 1
