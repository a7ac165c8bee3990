"""Short traces of episodes: the last steps' observations, actions and rewards.

A critique says *that* an episode failed; a trace shows *how* it ended, which is what a model editing the
policy's code can act on. Traces come from replaying a recorded episode (same candidate, same seed) on the
trusted side: with ``[execution] trusted_rollouts = true`` the env host, which policy code cannot reach,
records them (:func:`record_trace`, through the executor's render path, as ``ratchet replay --video``
renders). The driver reads a trace back as untrusted input all the same (:meth:`Trace.from_dict`: bounded
in size, every number checked), and a trace only ever goes into a prompt — no selection reads it.

Traces are kept short on purpose: at most :data:`MAX_STEPS` steps are recorded, a prompt shows fewer, and
every observation or action keeps its first :data:`MAX_VALUES` numbers, rounded to 4 significant digits.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ratchet.rollout import Episode, run_episode

__all__ = [
    "MAX_STEPS",
    "MAX_TRACE_BYTES",
    "MAX_VALUES",
    "TRACE_SUFFIX",
    "Step",
    "Trace",
    "TraceError",
    "read_trace",
    "record_trace",
    "render_mode_for",
]

#: A render path ending so asks for a trace (JSON) instead of a video.
TRACE_SUFFIX = ".json"
#: Most steps a trace keeps (the last ones of the episode).
MAX_STEPS = 50
#: Most numbers kept of one observation or action.
MAX_VALUES = 16
#: Most bytes of a trace file the driver reads.
MAX_TRACE_BYTES = 256 * 1024


class TraceError(ValueError):
    """A trace that is not what :func:`record_trace` writes (one line: what is wrong)."""


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _numbers(x: Any) -> tuple[float, ...]:
    """The first :data:`MAX_VALUES` numbers of an observation or action, rounded (non-finite ones kept as is)."""
    try:
        flat = np.asarray(x, dtype=np.float64).ravel()[:MAX_VALUES]
    except (TypeError, ValueError):
        return ()
    return tuple(_round(float(v)) if math.isfinite(v) else float(v) for v in flat)


@dataclass(frozen=True)
class Step:
    """One env step of a trace.

    Attributes:
        t: The step's index in the episode (0 is the first action).
        observation: What the policy saw before acting (first :data:`MAX_VALUES` numbers, rounded).
        action: What it did (a scalar action as one number).
        reward: The reward the step returned.
    """

    t: int
    observation: tuple[float, ...]
    action: tuple[float, ...]
    reward: float


@dataclass(frozen=True)
class Trace:
    """The last steps of one replayed episode.

    Attributes:
        seed: The episode's seed.
        episode_return: The replay's return (return units).
        length: The replay's length (env steps).
        ending: ``"terminated"``, ``"truncated"`` or ``"error"``.
        steps: The last steps, oldest first (at most :data:`MAX_STEPS`).
        final_observation: The observation after the last step (rounded), or None.
        error: The replay's error, or None.
    """

    seed: int
    episode_return: float
    length: int
    ending: str
    steps: tuple[Step, ...]
    final_observation: tuple[float, ...] | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what :func:`record_trace` writes and the ledger stores)."""
        return {"seed": self.seed, "episode_return": self.episode_return, "length": self.length,
                "ending": self.ending, "error": self.error,
                "final_observation": None if self.final_observation is None else list(self.final_observation),
                "steps": [[s.t, list(s.observation), list(s.action), s.reward] for s in self.steps]}

    @classmethod
    def from_dict(cls, d: Any) -> Trace:
        """Read a trace written by :meth:`to_dict`, checking every field (it may come from a worker).

        Raises:
            TraceError: a field is missing, of the wrong type, or out of its bounds.
        """
        def num(x: Any, what: str) -> float:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise TraceError(f"{what}: expected a number, got {type(x).__name__}")
            return float(x)

        def nums(x: Any, what: str) -> tuple[float, ...]:
            if not isinstance(x, list) or len(x) > MAX_VALUES:
                raise TraceError(f"{what}: expected a list of at most {MAX_VALUES} numbers")
            return tuple(num(v, what) for v in x)

        def count(x: Any, what: str) -> int:
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**63:
                raise TraceError(f"{what}: expected a whole number in [0, 2**63), got {str(x)[:40]!r}")
            return x

        if not isinstance(d, Mapping):
            raise TraceError(f"expected an object, got {type(d).__name__}")
        try:
            raw_steps = d["steps"]
            if not isinstance(raw_steps, list) or len(raw_steps) > MAX_STEPS:
                raise TraceError(f"steps: expected a list of at most {MAX_STEPS} steps")
            steps = []
            for s in raw_steps:
                if not isinstance(s, list) or len(s) != 4:
                    raise TraceError("a step: expected [t, observation, action, reward]")
                steps.append(Step(count(s[0], "step t"), nums(s[1], "observation"), nums(s[2], "action"),
                                  num(s[3], "reward")))
            ending = d["ending"]
            if ending not in ("terminated", "truncated", "error"):
                raise TraceError(f"ending: expected terminated, truncated or error, got {str(ending)[:40]!r}")
            error = d.get("error")
            if error is not None and not isinstance(error, str):
                raise TraceError("error: expected text or null")
            final = d.get("final_observation")
            return cls(count(d["seed"], "seed"), num(d["episode_return"], "episode_return"),
                       count(d["length"], "length"), ending, tuple(steps),
                       None if final is None else nums(final, "final_observation"),
                       None if error is None else error[:300])
        except KeyError as exc:
            raise TraceError(f"missing field {exc}") from None

    def text(self, last: int = 10, names: Sequence[str] | None = None) -> str:
        """A few lines for a prompt: how the episode ended, then its last ``last`` steps as
        ``t: observation -> action, reward`` (numbers to 3 significant digits).

        Args:
            last: Most steps shown (the last ones).
            names: Names of the observation's components, shown once as a header when they fit.
        """
        def fmt(xs: Sequence[float]) -> str:
            return ("[" + ", ".join(f"{x:.3g}" for x in xs) + "]") if len(xs) != 1 else f"{xs[0]:.3g}"

        how = {"terminated": "the task ended it", "truncated": "the time limit cut it",
               "error": f"error: {self.error}"}[self.ending]
        shown = self.steps[-last:] if last > 0 else ()
        head = (f"- seed {self.seed}: return {self.episode_return:.4g} in {self.length} steps, {self.ending} "
                f"({how})")
        if not shown:
            return head
        lines = [head + f"; its last {len(shown)} steps as `step: observation -> action, reward`:"]
        if names and shown and len(names) >= len(shown[0].observation):
            lines.append("  observation = [" + ", ".join(names[:len(shown[0].observation)]) + "]")
        lines += [f"  {s.t}: {fmt(s.observation)} -> {fmt(s.action)}, {s.reward:+.3g}" for s in shown]
        if self.final_observation is not None:
            lines.append(f"  then: {fmt(self.final_observation)}")
        return "\n".join(lines)


class _StepRecorder:
    """An env proxy that keeps the last :data:`MAX_STEPS` (observation, action, reward) triples."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.action_space, self.observation_space = env.action_space, env.observation_space
        self.steps: deque[Step] = deque(maxlen=MAX_STEPS)
        self.obs: Any = None
        self.t = 0

    def reset(self, **kwargs: Any) -> Any:
        out = self.env.reset(**kwargs)
        self.obs, self.t = out[0], 0
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        self.steps.append(Step(self.t, _numbers(self.obs), _numbers(action), _round(float(out[1]))))
        self.obs, self.t = out[0], self.t + 1
        return out


def record_trace(env: Any, module: Any, params: Mapping[str, Any], seed: int, task: Any, path: str) -> Episode:
    """Run one episode through :func:`~ratchet.rollout.run_episode` (so its return equals a normal run's)
    and write its trace as JSON to ``path``. Runs where the env lives (the trusted env host).

    Args:
        env: A fresh environment of the task.
        module: The policy: anything with ``act`` (and optionally ``reset``).
        params: Parameter values.
        seed: The episode's seed.
        task: The task.
        path: The JSON file to write.

    Returns:
        The episode.
    """
    rec = _StepRecorder(env)
    ep = run_episode(rec, module.act, getattr(module, "reset", None), params, seed, task)
    final = ep.diagnostics.get("final_observation")
    trace = Trace(seed, _round(ep.episode_return) if math.isfinite(ep.episode_return) else 0.0, ep.length,
                  "error" if ep.error else ("terminated" if ep.terminated else "truncated"), tuple(rec.steps),
                  None if final is None else _numbers(final), None if ep.error is None else ep.error[:300])
    Path(path).write_text(json.dumps(trace.to_dict()), encoding="utf-8")
    return ep


def read_trace(path: str | Path) -> Trace:
    """A trace file written by :func:`record_trace`, read as untrusted input.

    Raises:
        TraceError: the file is missing, larger than :data:`MAX_TRACE_BYTES`, not JSON, or not a trace.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise TraceError(f"cannot read the trace: {exc.strerror or exc}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"the trace is larger than {MAX_TRACE_BYTES} bytes")
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TraceError("the trace is not JSON") from None
    return Trace.from_dict(d)


def render_mode_for(path: str | None) -> str | None:
    """The render mode an env needs for a render path: None for no path, a trace or transitions
    (:data:`ratchet.worldmodel.transitions.TRANSITIONS_SUFFIX`), else ``"rgb_array"``."""
    from ratchet.worldmodel.transitions import TRANSITIONS_SUFFIX

    return None if not path or str(path).endswith((TRACE_SUFFIX, TRANSITIONS_SUFFIX)) else "rgb_array"
