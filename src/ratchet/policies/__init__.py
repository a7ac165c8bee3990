"""Policy kinds: how a worker turns a candidate into something with ``act(observation, params)``.

A candidate (:class:`ratchet.policy.Candidate`) has a kind:

- ``program`` — a policy file (``PARAMETERS`` + ``act``); see :mod:`ratchet.policy`.
- ``mlp`` — a feed-forward network whose weights are data (an ``.npz`` artifact, read with
  ``allow_pickle=False``); see :mod:`ratchet.policies.mlp`.
- ``sb3`` — a Stable-Baselines3 model (``.zip``). SB3 zips contain pickles, so they are opened only
  inside sandboxed workers, never by the driver; see :mod:`ratchet.policies.sb3`.
- ``residual`` — a program plus a learned correction (an ``mlp`` artifact whose output layer starts at
  exactly zero, so the starting candidate *is* its base); see :mod:`ratchet.policies.residual`.
- ``source`` — a folder of source files in any language with marked regions, built and run in the sandbox;
  see :mod:`ratchet.policies.source`.

Workers call :func:`build`; each kind module defines ``build(source, artifacts)``. Driver-side code
(start candidates, export, descriptions) lives beside it and never unpickles anything.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ratchet.errors import PolicyError
from ratchet.npz import NpzError, load_npz, npz_headers
from ratchet.policy import FOLDER_KINDS, POLICY_KINDS, SOURCE_KINDS, PolicyProgram, parse_policy

__all__ = ["POLICY_KINDS", "build", "describe_artifact", "kind_module", "read_program"]


def read_program(kind: str, source: str, path: str = "<policy>", *, functions: Any = None,
                 dims: Mapping[str, int] | None = None) -> PolicyProgram:
    """The program a candidate of ``kind`` carries, read from its source without running anything: a policy
    file's ``PARAMETERS`` (program, residual), a folder's marked regions (source), or an empty program (networks).

    Args:
        kind: The policy kind.
        source: The candidate's source.
        path: Where it came from (messages).
        functions: The task's functions, checked in a policy file (None checks none).
        dims: The task's sizes for array shapes written as ``"obs"``/``"act"``.

    Raises:
        PolicyError: the source is not valid for its kind.
    """
    if kind in SOURCE_KINDS:
        return parse_policy(source, path, dims=dims, functions=functions)
    if kind in FOLDER_KINDS:
        from ratchet.policies.source import program_of

        return program_of(source)
    return PolicyProgram("", ())


def kind_module(kind: str) -> Any:
    """The module that implements policy kind ``kind`` (``ratchet.policies.<kind>``).

    Raises:
        PolicyError: unknown kind, or the kind's module cannot be imported (a missing extra, e.g.
            ``pip install 'policy-ratchet[rl]'`` for ``sb3``).
    """
    if kind not in POLICY_KINDS or kind == "program":
        raise PolicyError(f"unknown policy kind {kind!r}; known: {', '.join(POLICY_KINDS)}")
    try:
        return importlib.import_module(f"ratchet.policies.{kind}")
    except ImportError as exc:
        raise PolicyError(f"policy kind {kind!r} needs {exc.name or exc}: pip install 'policy-ratchet[rl]'") from None


def build(kind: str, source: str, artifacts: Mapping[str, bytes]) -> Any:
    """Build a policy of ``kind`` in a worker: an object with ``act(observation, params)`` and
    ``reset(params, seed)`` (the worker binds ``OBSERVATION_SPACE``/``ACTION_SPACE`` on it first).

    Args:
        kind: A policy kind other than ``"program"``.
        source: The candidate's source (the base program of a residual policy; empty otherwise).
        artifacts: The candidate's artifact bytes by role (e.g. ``{"weights": b"..."}``).

    Raises:
        PolicyError, or whatever the kind's loader raises: the worker records it as the episode's
        "policy failed to load" error.
    """
    return kind_module(kind).build(source, artifacts)


def describe_artifact(role: str, data: bytes | None, *, with_role: bool = True) -> str:
    """One line about a candidate's artifact for ``show`` and the report, read in the driver without
    unpickling: a network (roles ``weights``, ``correction``) as layer sizes, activation, weight count and
    norm (:func:`ratchet.policies.mlp.describe`); an SB3 model (role ``model``) only as its size, since
    opening it would unpickle it; any other role (a refiner's training state, e.g. ``critic``) as the
    count, size and norm of its arrays when it is an ``.npz``, else its size.

    Args:
        role: The artifact's role in its candidate.
        data: Its bytes, or None when they were not read.
        with_role: Start the line with ``"<role>: "``.
    """
    head = f"{role}: " if with_role else ""
    if data is None:
        return f"{head}not read"
    if role == "model":
        return f"{head}Stable-Baselines3 .zip, {len(data):,} bytes (opened only in sandboxed workers)"
    if role in ("weights", "correction"):
        from ratchet.policies.mlp import describe

        try:
            return head + describe(data)
        except PolicyError as exc:
            return f"{head}{len(data):,} bytes ({exc})"
    return head + _describe_arrays(data)


def _describe_arrays(data: bytes) -> str:
    """Another role (e.g. a PPO refiner's ``critic``: training state, unused when acting): its arrays' count and
    size from their ``.npy`` headers (nothing decompressed), and their norm when they fit what the driver loads
    (:func:`ratchet.npz.load_npz`); anything else as its size."""
    import numpy as np

    try:
        headers = npz_headers(data, limit=2**62)
    except NpzError:
        return f"{len(data):,} bytes"
    line = f"{len(headers)} arrays, {sum(h.size for h in headers):,} numbers"
    if not all(h.dtype.kind in "biuf" for h in headers):
        return line
    try:
        arrays = load_npz(data)
    except NpzError as exc:
        return f"{line} (not loaded: {exc})"
    norm = float(np.sqrt(sum(float(np.dot(x, x)) for a in arrays.values() for x in [a.ravel().astype(np.float64)])))
    return f"{line}, norm {norm:.4g}"
