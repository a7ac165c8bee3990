"""Labelled data sets of corrections (DAgger, HG-DAgger, demonstrations), and Minari import/export.

A :class:`Dataset` is one table of labelled env steps: the observation the policy saw, the action the
*expert* gives there (the label), the action that was *executed*, who controlled the step, and where the
step came from (round, episode, seed, step index). Its bytes are an ``.npz`` (read with
``allow_pickle=False``, so the driver may open it), stored as a content-addressed artifact (role
``"dataset"``) carried by every student candidate a correction refiner proposes.

Arrays (``N`` labelled steps; ``D`` the flattened observation size; actions ``(N,)`` int64 for a Discrete
space, ``(N, A)`` float64 for a Box one):

- ``obs`` ``(N, D)`` float64, ``next_obs`` ``(N, D)`` float64 — the observation before and after the step;
- ``label`` — the expert's action (what behaviour cloning fits); ``executed`` — the action taken;
- ``reward`` ``(N,)`` float64; ``terminated``, ``truncated`` ``(N,)`` bool (Gymnasium's flags of that step);
- ``expert`` ``(N,)`` bool — the expert was in control (a takeover or a demonstration);
- ``round`` ``(N,)`` int64 (0: initial demonstrations), ``episode`` ``(N,)`` int64 (index, unique in the
  data set), ``seed`` ``(N,)`` int64 (the episode's reset seed), ``step`` ``(N,)`` int64 (index in it);
- ``meta``: JSON as uint8 (``action``: ``"discrete"``/``"box"``, ``env_id``).

Consecutive steps of one episode form a *segment*; Minari (Farama's offline RL data standard) stores
each segment as one of its episodes (:func:`to_minari`, :func:`from_minari`).
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ratchet.errors import RatchetError
from ratchet.npz import NpzError, load_npz

__all__ = ["DataError", "Dataset", "from_minari", "run_dataset", "to_minari"]

_FIELDS = ("obs", "next_obs", "label", "executed", "reward", "terminated", "truncated", "expert", "round",
           "episode", "seed", "step")
#: Info keys ratchet writes into a Minari episode (per step) so a round trip keeps every field.
_MINARI_INFO = ("ratchet_executed", "ratchet_expert", "ratchet_round", "ratchet_episode", "ratchet_seed",
                "ratchet_step", "ratchet_terminated", "ratchet_truncated")


class DataError(RatchetError):
    """A data set that cannot be read, written or combined."""


@dataclass(frozen=True)
class Dataset:
    """Labelled env steps (see the module doc for the fields, shapes and dtypes)."""

    obs: np.ndarray
    next_obs: np.ndarray
    label: np.ndarray
    executed: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    expert: np.ndarray
    round: np.ndarray
    episode: np.ndarray
    seed: np.ndarray
    step: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    @classmethod
    def empty(cls, obs_dim: int, action: str, act_dim: int = 0, **meta: Any) -> Dataset:
        """No steps, for observations of ``obs_dim`` floats and ``action`` ``"discrete"`` or ``"box"``."""
        a = np.zeros(0, np.int64) if action == "discrete" else np.zeros((0, act_dim))
        z = np.zeros(0, np.int64)
        b = np.zeros(0, bool)
        return cls(np.zeros((0, obs_dim)), np.zeros((0, obs_dim)), a, a.copy(), np.zeros(0), b, b.copy(), b.copy(),
                   z, z.copy(), z.copy(), z.copy(), {"action": action, **meta})

    @classmethod
    def from_steps(cls, steps: Sequence[Mapping[str, Any]], action: str, obs_dim: int, act_dim: int = 0,
                   **meta: Any) -> Dataset:
        """Build from one dict per step with the field names as keys."""
        if not steps:
            return cls.empty(obs_dim, action, act_dim, **meta)
        cols: dict[str, Any] = {}
        for f in _FIELDS:
            v = [s[f] for s in steps]
            if f in ("obs", "next_obs"):
                cols[f] = np.asarray(v, dtype=np.float64).reshape(len(steps), -1)
            elif f in ("label", "executed"):
                cols[f] = (np.asarray(v, dtype=np.int64) if action == "discrete"
                           else np.asarray(v, dtype=np.float64).reshape(len(steps), -1))
            elif f == "reward":
                cols[f] = np.asarray(v, dtype=np.float64)
            elif f in ("terminated", "truncated", "expert"):
                cols[f] = np.asarray(v, dtype=bool)
            else:
                cols[f] = np.asarray(v, dtype=np.int64)
        return cls(**cols, meta={"action": action, **meta})

    # -- bytes -----------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The ``.npz`` artifact (equal data sets give equal bytes)."""
        arrays = {f: getattr(self, f) for f in _FIELDS}
        arrays["meta"] = np.frombuffer(json.dumps(dict(self.meta), sort_keys=True).encode(), np.uint8)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Dataset:
        """Read an artifact written by :meth:`to_bytes` (no pickles; at most :func:`ratchet.npz.unpack_limit`
        bytes unpacked).

        Raises:
            DataError: not a data set artifact, one that unpacks to more than the driver loads, or columns of
                different lengths.
        """
        try:
            arrays = load_npz(data)
        except NpzError as exc:
            raise DataError(f"not a ratchet data set: {exc}") from None
        try:
            meta = json.loads(arrays.pop("meta").tobytes().decode())
            ds = cls(**{f: arrays[f] for f in _FIELDS}, meta=meta)
        except Exception as exc:  # noqa: BLE001 - a malformed file fails in many ways; each one is a DataError
            raise DataError(f"not a ratchet data set: {type(exc).__name__}: {exc}"[:300]) from None
        n = len(ds)
        if any(getattr(ds, f).shape[:1] != (n,) for f in _FIELDS):
            raise DataError("not a ratchet data set: columns of different lengths")
        return ds

    def check_spaces(self, observation_space: Any, action_space: Any, task_name: str) -> None:
        """Check that the data set can teach a policy for these spaces, before any training job reads it.

        Args:
            observation_space: The task's observation space (its flattened size must be the data's ``obs`` width).
            action_space: The task's action space: ``Discrete(n)`` wants whole labels in ``[0, n)``, a ``Box`` finite
                label rows of its flattened size.
            task_name: How messages name the task.

        Raises:
            DataError: no steps, ``meta`` not a table, non-finite observations, or observations or labels that do not
                fit the spaces; one line naming what is wrong.
        """
        n = len(self)
        if not n:
            raise DataError("no steps: an empty data set teaches nothing")
        if not isinstance(self.meta, Mapping):
            raise DataError(f"its meta is a {type(self.meta).__name__}, not a table")
        obs_dim = int(np.prod(getattr(observation_space, "shape", None) or (0,)))
        if self.obs.ndim != 2 or self.obs.shape[1] != obs_dim or not np.issubdtype(self.obs.dtype, np.number):
            got = self.obs.shape[1] if self.obs.ndim == 2 else f"shape {self.obs.shape[1:]}"
            raise DataError(f"observations of {got} numbers, but {task_name}'s have {obs_dim}")
        if not np.isfinite(self.obs).all():
            raise DataError("some observations are NaN or infinite")
        if hasattr(action_space, "n"):  # Discrete
            k = int(action_space.n)
            if not np.issubdtype(self.label.dtype, np.integer) or self.label.ndim != 1:
                raise DataError(f"labels are {self.label.dtype} of shape {self.label.shape[1:]}, but {task_name}'s "
                                f"actions are whole numbers in [0, {k})")
            if n and (int(self.label.min()) < 0 or int(self.label.max()) >= k):
                bad = int(self.label.min()) if int(self.label.min()) < 0 else int(self.label.max())
                raise DataError(f"label {bad} is out of range for {task_name}'s {k} actions [0, {k})")
            return
        act_dim = int(np.prod(getattr(action_space, "shape", None) or (0,)))
        if (self.label.ndim != 2 or self.label.shape[1] != act_dim or not np.issubdtype(self.label.dtype, np.floating)
                or not np.isfinite(self.label).all()):
            raise DataError(f"labels must be finite rows of {act_dim} numbers for {task_name}'s actions, got "
                            f"{self.label.dtype} of shape {self.label.shape[1:]}")

    # -- combining -------------------------------------------------------------------------------
    def concat(self, other: Dataset) -> Dataset:
        """``self`` then ``other`` (DAgger's aggregation); ``other``'s episode indices are shifted past ours.

        Raises:
            DataError: different action kinds or observation sizes.
        """
        if not len(other):
            return self
        if not len(self):
            return other
        if self.meta.get("action") != other.meta.get("action") or self.obs.shape[1:] != other.obs.shape[1:]:
            raise DataError(f"cannot aggregate data sets of different spaces ({self.meta.get('action')} "
                            f"{self.obs.shape[1:]} vs {other.meta.get('action')} {other.obs.shape[1:]})")
        shift = int(self.episode.max()) + 1 - int(other.episode.min())
        cols = {f: np.concatenate([getattr(self, f), getattr(other, f)]) for f in _FIELDS}
        cols["episode"] = np.concatenate([self.episode, other.episode + shift])
        return Dataset(**cols, meta=dict(self.meta))

    def segments(self) -> Iterator[tuple[int, int]]:
        """``(start, end)`` row ranges (end exclusive) of consecutive steps of one episode."""
        n = len(self)
        if not n:
            return
        brk = np.flatnonzero((np.diff(self.episode) != 0) | (np.diff(self.step) != 1)) + 1
        bounds = [0, *brk.tolist(), n]
        yield from itertools.pairwise(bounds)

    def take(self, rows: Any) -> Dataset:
        """The rows ``rows`` (indices or a mask)."""
        return Dataset(**{f: getattr(self, f)[rows] for f in _FIELDS}, meta=dict(self.meta))

    def summary(self) -> dict[str, Any]:
        """Counts for the ledger and reports: steps, expert-controlled steps, episodes, segments, rounds."""
        return {"steps": len(self), "expert_steps": int(self.expert.sum()),
                "episodes": len(np.unique(self.episode)), "segments": sum(1 for _ in self.segments()),
                "rounds": sorted(int(r) for r in np.unique(self.round))}


def run_dataset(run: str | Path, runs_dir: str | Path = "runs", *, candidate: str | None = None,
                storage: str | None = None) -> Dataset:
    """The data set a run's correction refiner collected: the one carried by candidate ``candidate`` (an id),
    by default the newest aggregate of the run (its last ``training_finished`` event with a data set).

    Raises:
        RunNotFoundError: no such run.
        DataError: the run (or candidate) has no data set.
    """
    from ratchet.runs import open_ledger

    ledger = open_ledger(run, runs_dir, readonly=True, storage=storage)
    try:
        found = None
        for e in ledger.read():
            p = e.payload
            if candidate is None and e.type.value == "training_finished":
                for out in p.get("outputs", []):
                    found = out.get("artifacts", {}).get("dataset", found)
            elif candidate is not None and e.type.value == "candidate_proposed" and p["candidate"]["id"] == candidate:
                found = (p["candidate"].get("artifacts") or {}).get("dataset")
        if found is None:
            raise DataError(f"run {run} has no data set" + (f" for candidate {candidate}" if candidate else "")
                            + " (only dagger, hg-dagger and bc refiners collect one)")
        return Dataset.from_bytes(ledger.get_artifact(found))
    finally:
        ledger.close()


# -- Minari ----------------------------------------------------------------------------------------
def to_minari(dataset: Dataset, path: str | Path, *, env_id: str | None = None, observation_space: Any = None,
              action_space: Any = None, dataset_id: str | None = None, description: str | None = None,
              data_format: str = "hdf5") -> Path:
    """Write ``dataset`` as a Minari data set in the folder ``path`` (Minari's layout: ``path/data/``).

    Each segment (:meth:`Dataset.segments`) becomes one Minari episode: ``observations`` are the segment's
    observations plus the last step's next observation (``T + 1``), ``actions`` the expert's labels,
    ``rewards``/``terminations``/``truncations`` as recorded, except that a segment which stops before its
    episode ended (the expert handed back) is marked truncated there, as Minari expects a finished episode;
    the true flags, the executed action, who was in control and the origin of each step are kept in the
    episode's ``infos`` (``ratchet_*`` keys), so :func:`from_minari` restores the data set exactly. Load it
    elsewhere with ``minari.MinariDataset(path)`` (or copy it under ``$MINARI_DATASETS_PATH``).

    Args:
        dataset: The data.
        path: A folder that does not exist yet.
        env_id: The Gymnasium id the data comes from (its spec is recorded; spaces are taken from it).
        observation_space, action_space: The spaces, when ``env_id`` is not given.
        dataset_id: Minari's id (``[namespace/]name-v<version>``); default ``ratchet/<env>-corrections-v0``.
        description: Free text stored in the metadata.
        data_format: ``"hdf5"`` (default, h5py) or ``"arrow"`` (pyarrow).

    Returns:
        ``path``.

    Raises:
        DataError: Minari is not installed, ``path`` exists, or the data does not fit the spaces.
    """
    try:
        from minari.data_collector import EpisodeBuffer
        from minari.dataset.minari_storage import MinariStorage
    except ImportError:
        raise DataError("Minari export needs the minari package: pip install 'minari[hdf5]'") from None
    import gymnasium as gym

    path = Path(path)
    if path.exists():
        raise DataError(f"{path} exists; give a new folder for the Minari data set")
    env_spec = None
    env_id = env_id or dataset.meta.get("env_id")
    if env_id:
        env_spec = gym.spec(env_id)
        if observation_space is None or action_space is None:
            env = gym.make(env_id)
            observation_space = observation_space or env.observation_space
            action_space = action_space or env.action_space
            env.close()
    if observation_space is None or action_space is None:
        raise DataError("give env_id, or observation_space and action_space, to write a Minari data set")
    discrete = dataset.meta.get("action") == "discrete"
    buffers = []
    for k, (a, b) in enumerate(dataset.segments()):
        obs = [_unflat(o, observation_space) for o in dataset.obs[a:b]] + [_unflat(dataset.next_obs[b - 1],
                                                                                   observation_space)]
        acts = [int(x) if discrete else np.asarray(x, dtype=action_space.dtype).reshape(action_space.shape)
                for x in dataset.label[a:b]]
        term = dataset.terminated[a:b].copy()
        trunc = dataset.truncated[a:b].copy()
        if not (term[-1] or trunc[-1]):
            trunc[-1] = True  # the segment ends before its episode did
        infos = {"ratchet_executed": _info(dataset.executed[a:b], discrete),
                 "ratchet_expert": _pad(dataset.expert[a:b]), "ratchet_round": _pad(dataset.round[a:b]),
                 "ratchet_episode": _pad(dataset.episode[a:b]), "ratchet_seed": _pad(dataset.seed[a:b]),
                 "ratchet_step": _pad(dataset.step[a:b]), "ratchet_terminated": _pad(dataset.terminated[a:b]),
                 "ratchet_truncated": _pad(dataset.truncated[a:b])}
        buffers.append(EpisodeBuffer(id=k, seed=int(dataset.seed[a]), observations=obs, actions=acts,
                                     rewards=[float(r) for r in dataset.reward[a:b]],
                                     terminations=[bool(t) for t in term], truncations=[bool(t) for t in trunc],
                                     infos=infos))
    name = dataset_id or f"ratchet/{(env_id or 'env').split('/')[-1].split('-v')[0]}-corrections-v0"
    from minari import __version__

    (path / "data").mkdir(parents=True)
    storage = MinariStorage.new(path / "data", observation_space=observation_space, action_space=action_space,
                                env_spec=env_spec, data_format=data_format)
    meta = {"dataset_id": name, "minari_version": __version__, "algorithm_name": "ratchet corrections",
            "author": {"ratchet"}, "author_email": {"unknown"}, "code_permalink": "https://example.invalid/ratchet",
            "description": description or "Expert-labelled steps recorded by ratchet (DAgger, HG-DAgger, "
                                          "demonstrations)"}
    storage.update_metadata(meta)
    storage.update_episodes(buffers)
    return path


def from_minari(source: str | Path | Any, *, expert: bool = True) -> Dataset:
    """Read a Minari data set (a folder written by :func:`to_minari` or by Minari itself, or a
    ``minari.MinariDataset``) as a :class:`Dataset`.

    A data set written by :func:`to_minari` comes back exactly. Any other Minari data set is taken as
    demonstrations: every step labelled with its recorded action, under expert control (``expert``) unless
    told otherwise, round 0, one ratchet episode per Minari episode.

    Raises:
        DataError: Minari is not installed, the folder is no Minari data set, or its observations or
            actions are not flat Box/Discrete data.
    """
    try:
        import minari
    except ImportError:
        raise DataError("Minari import needs the minari package: pip install 'minari[hdf5]'") from None
    from gymnasium import spaces

    if isinstance(source, (str, Path)):
        try:
            ds = minari.MinariDataset(Path(source) / "data" if (Path(source) / "data").is_dir() else source)
        except Exception as exc:  # noqa: BLE001 - Minari raises many types for a bad path; each one is a DataError
            raise DataError(f"{source}: not a Minari data set ({type(exc).__name__}: {exc})"[:300]) from None
    else:
        ds = source
    discrete = isinstance(ds.action_space, spaces.Discrete)
    if not discrete and not isinstance(ds.action_space, spaces.Box):
        raise DataError(f"only Discrete and Box action spaces are supported, got {type(ds.action_space).__name__}")
    if not isinstance(ds.observation_space, spaces.Box):
        raise DataError(f"only Box observation spaces are supported, got {type(ds.observation_space).__name__}")
    obs_dim = int(np.prod(ds.observation_space.shape))
    act_dim = 0 if discrete else int(np.prod(ds.action_space.shape))
    env_id = ds.env_spec.id if ds.env_spec is not None else None
    out = Dataset.empty(obs_dim, "discrete" if discrete else "box", act_dim,
                        **({"env_id": env_id} if env_id else {}))
    parts = []
    for i, ep in enumerate(ds.iterate_episodes()):
        o = np.asarray(ep.observations, dtype=np.float64).reshape(len(ep.observations), -1)
        t = len(ep.rewards)
        acts = np.asarray(ep.actions)
        label = acts.astype(np.int64).reshape(t) if discrete else acts.astype(np.float64).reshape(t, -1)
        info = ep.infos if isinstance(ep.infos, dict) else {}
        ours = all(k in info for k in _MINARI_INFO)

        def col(key: str, default: Any, dtype: Any, info: dict[str, Any] = info, t: int = t,
                ours: bool = ours) -> np.ndarray:  # this episode's info, t and ours, bound here
            return np.asarray(info[key], dtype=dtype)[1:t + 1] if ours else np.asarray(default, dtype=dtype)

        executed = (np.asarray(info["ratchet_executed"])[1:t + 1].astype(label.dtype).reshape(label.shape) if ours
                    else label.copy())
        parts.append(Dataset(
            obs=o[:t], next_obs=o[1:t + 1], label=label, executed=executed,
            reward=np.asarray(ep.rewards, dtype=np.float64),
            terminated=col("ratchet_terminated", ep.terminations, bool),
            truncated=col("ratchet_truncated", ep.truncations, bool),
            expert=col("ratchet_expert", np.full(t, expert), bool), round=col("ratchet_round", np.zeros(t), np.int64),
            episode=col("ratchet_episode", np.full(t, i), np.int64),
            seed=col("ratchet_seed", np.full(t, -1), np.int64),
            step=col("ratchet_step", np.arange(t), np.int64), meta=dict(out.meta)))
    if not parts:
        return out
    cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS}
    return Dataset(**cols, meta=dict(out.meta))


def _unflat(x: np.ndarray, space: Any) -> np.ndarray:
    return np.asarray(x, dtype=space.dtype).reshape(space.shape)


def _pad(a: np.ndarray) -> np.ndarray:
    """A per-step column as a Minari info array: Minari infos have ``T + 1`` rows, the reset's first, so
    row ``k + 1`` describes step ``k`` (the reset row repeats step 0's values)."""
    return np.concatenate([a[:1], a])


def _info(a: np.ndarray, discrete: bool) -> np.ndarray:
    return _pad(a.astype(np.int64) if discrete else a.astype(np.float64))
