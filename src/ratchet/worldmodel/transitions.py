"""Transitions a world model learns from: (observation, action, reward, next observation, terminated, truncated).

They are recorded where the env runs on the trusted side (:func:`record_transitions`, through the executor's render
path as traces are, :mod:`ratchet.trace`), never taken from a policy's process; the driver reads them back as
untrusted bytes all the same (:meth:`Transitions.from_bytes`: no pickles, bounded in size, every number checked).
A run keeps them as ``.npz`` artifacts beside its ledger; :meth:`Transitions.joined` bounds the data set it grows.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ratchet.npz import NpzError, load_npz
from ratchet.rollout import Episode, run_episode

__all__ = ["MAX_TRANSITIONS", "TRANSITIONS_SUFFIX", "Transitions", "TransitionsError", "action_width",
           "record_transitions"]

#: A render path ending so asks for an episode's transitions (``.npz``) instead of a video or a trace.
TRANSITIONS_SUFFIX = ".npz"
#: Most transitions one data set keeps (the newest), and one recorded episode gives (its first ones).
MAX_TRANSITIONS = 100_000
#: Most numbers of one observation or action a data set keeps.
MAX_WIDTH = 256
_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


class TransitionsError(ValueError):
    """Bytes that are not a data set :meth:`Transitions.to_bytes` writes (one line: what is wrong)."""


def action_width(action_space: Any) -> int:
    """Numbers one action is encoded to: ``n`` (one-hot) for a Discrete space, else its flattened size."""
    n = getattr(action_space, "n", None)  # gymnasium's Discrete; a Box has a shape instead
    return int(n) if n is not None else int(np.prod(action_space.shape))


def _encode(action: Any, n_discrete: int) -> np.ndarray:
    if n_discrete:
        out = np.zeros(n_discrete, dtype=np.float32)
        out[int(action) % n_discrete] = 1.0
        return out
    return np.asarray(action, dtype=np.float32).ravel()


@dataclass(frozen=True)
class Transitions:
    """A data set of transitions, as arrays of one row per env step.

    Attributes:
        obs: ``(n, d_obs)`` float32, the observation before the step.
        action: ``(n, d_act)`` float32: a Box action flattened, a Discrete one one-hot.
        reward: ``(n,)`` float32.
        next_obs: ``(n, d_obs)`` float32, the observation after the step.
        terminated: ``(n,)`` bool (Gymnasium's ``terminated``; never merged with ``truncated``).
        truncated: ``(n,)`` bool.
        first: ``(n,)`` bool: the row is an episode's first step (its ``obs`` is a start state).
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    first: np.ndarray

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    @classmethod
    def empty(cls, d_obs: int, d_act: int) -> Transitions:
        """No transitions, with these widths."""
        f = np.zeros((0, d_obs), np.float32)
        return cls(f, np.zeros((0, d_act), np.float32), np.zeros(0, np.float32), f.copy(), np.zeros(0, bool),
                   np.zeros(0, bool), np.zeros(0, bool))

    def joined(self, other: Transitions, limit: int = MAX_TRANSITIONS) -> Transitions:
        """This data set followed by ``other``, keeping the newest ``limit`` rows.

        Raises:
            TransitionsError: the widths differ.
        """
        if len(self) and (self.obs.shape[1] != other.obs.shape[1] or self.action.shape[1] != other.action.shape[1]):
            raise TransitionsError(f"widths differ: obs {self.obs.shape[1]} vs {other.obs.shape[1]}, action "
                                   f"{self.action.shape[1]} vs {other.action.shape[1]}")
        if not len(self):
            return other.tail(limit)
        return Transitions(*(np.concatenate([getattr(self, f), getattr(other, f)]) for f in (*_FIELDS, "first"))
                           ).tail(limit)

    def tail(self, limit: int) -> Transitions:
        """The newest ``limit`` rows."""
        if len(self) <= limit:
            return self
        return Transitions(*(getattr(self, f)[-limit:] for f in (*_FIELDS, "first")))

    def starts(self) -> np.ndarray:
        """``(k, d_obs)``: the observations episodes started from (every row's ``obs`` when none is marked)."""
        return self.obs[self.first] if self.first.any() else self.obs

    def to_bytes(self) -> bytes:
        """The ``.npz`` (compressed, no pickles) :meth:`from_bytes` reads."""
        buf = io.BytesIO()
        np.savez_compressed(buf, **{f: getattr(self, f) for f in (*_FIELDS, "first")})
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Transitions:
        """Read a data set, trusting nothing: bounded unpacking (:func:`ratchet.npz.load_npz`), the arrays' names,
        shapes and dtypes, and finite numbers are all checked.

        Raises:
            TransitionsError: one line saying what is wrong.
        """
        try:
            arrays = load_npz(data)
        except NpzError as exc:
            raise TransitionsError(str(exc)) from None
        names = (*_FIELDS, "first")
        if set(arrays) != set(names):
            raise TransitionsError(f"arrays {sorted(arrays)} (expected {sorted(names)})")
        n = arrays["reward"].shape[0] if arrays["reward"].ndim == 1 else -1
        if n < 0 or n > MAX_TRANSITIONS:
            raise TransitionsError(f"reward of shape {arrays['reward'].shape} (expected (n,), n ≤ {MAX_TRANSITIONS})")
        out = {}
        for name in names:
            a = arrays[name]
            flat = name in ("reward", "terminated", "truncated", "first")
            if a.shape[0:1] != (n,) or a.ndim != (1 if flat else 2) or (not flat and not 0 < a.shape[1] <= MAX_WIDTH):
                raise TransitionsError(f"{name} of shape {a.shape} (expected ({n},{'' if flat else ' d'}))")
            if name in ("terminated", "truncated", "first"):
                if a.dtype != bool:
                    raise TransitionsError(f"{name} of dtype {a.dtype} (expected bool)")
            elif a.dtype.kind not in "fiu" or not np.isfinite(a).all():
                raise TransitionsError(f"{name} is not all finite numbers")
            out[name] = a if a.dtype == bool else a.astype(np.float32)
        if out["obs"].shape != out["next_obs"].shape:
            raise TransitionsError(f"obs {out['obs'].shape} and next_obs {out['next_obs'].shape} differ")
        return cls(**out)


class _Recorder:
    """An env proxy that keeps every step's transition (up to :data:`MAX_TRANSITIONS`)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.action_space, self.observation_space = env.action_space, env.observation_space
        n = getattr(env.action_space, "n", None)
        self.n_discrete = int(n) if n is not None else 0
        self.rows: list[tuple[Any, ...]] = []
        self.obs: Any = None

    def reset(self, **kwargs: Any) -> Any:
        out = self.env.reset(**kwargs)
        self.obs = out[0]
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        if len(self.rows) < MAX_TRANSITIONS:
            self.rows.append((np.asarray(self.obs, np.float32).ravel()[:MAX_WIDTH], _encode(action, self.n_discrete),
                              float(out[1]), np.asarray(out[0], np.float32).ravel()[:MAX_WIDTH], bool(out[2]),
                              bool(out[3])))
        self.obs = out[0]
        return out


def record_transitions(env: Any, module: Any, params: Mapping[str, Any], seed: int, task: Any, path: str) -> Episode:
    """Run one episode through :func:`~ratchet.rollout.run_episode` (so its return equals a normal run's) and write
    its transitions to ``path`` (:meth:`Transitions.to_bytes`). Runs where the env lives (the trusted env host).

    Args:
        env: A fresh environment of the task.
        module: The policy: anything with ``act`` (and optionally ``reset``).
        params: Parameter values.
        seed: The episode's seed.
        task: The task.
        path: The ``.npz`` file to write (ends in :data:`TRANSITIONS_SUFFIX`).

    Returns:
        The episode.
    """
    rec = _Recorder(env)
    ep = run_episode(rec, module.act, getattr(module, "reset", None), params, seed, task)
    d_obs = int(np.prod(env.observation_space.shape))
    data = Transitions.empty(min(d_obs, MAX_WIDTH), action_width(env.action_space))
    rows = [r for r in rec.rows if all(math.isfinite(x) for x in (r[2],)) and np.isfinite(r[0]).all()
            and np.isfinite(r[1]).all() and np.isfinite(r[3]).all()]
    if rows:
        cols = list(zip(*rows))
        first = np.zeros(len(rows), bool)
        first[0] = len(rows) == len(rec.rows)  # the episode's start state only when nothing before it was dropped
        data = Transitions(np.stack(cols[0]), np.stack(cols[1]), np.asarray(cols[2], np.float32), np.stack(cols[3]),
                           np.asarray(cols[4], bool), np.asarray(cols[5], bool), first)
    Path(path).write_bytes(data.to_bytes())
    return ep
