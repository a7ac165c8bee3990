"""``residual`` policies: a base policy (a program) plus a learned correction.

For a Box action space the action is ``clip(base(o) + r(o), low, high)``; for a Discrete one the base's
action gets score 1, every other action 0, the correction ``r(o)`` (one score per action) is added and the
best score wins. ``r`` is an ``mlp`` network (:mod:`ratchet.policies.mlp`, artifact role
``"correction"``) whose output layer starts at exactly zero, so the starting candidate *is* its base:
where the correction is exactly zero the base's action is returned untouched (bit for bit, unclipped).
The base program's ``PARAMETERS`` stay the candidate's parameters, so CMA-ES can tune the base while an
RL refiner trains the correction (residual policy learning: Silver et al., "Residual Policy Learning",
2018; Johannink et al., "Residual Reinforcement Learning for Robot Control", 2019).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ratchet.policies.mlp import MLP, load_weights
from ratchet.policy import bind_spaces, compile_policy

__all__ = ["ResidualPolicy", "build", "combine"]


def combine(base_action: Any, correction: np.ndarray, mlp: MLP) -> Any:
    """The residual action from the base's action and the correction's output (see the module doc)."""
    if not correction.any():
        return base_action
    if mlp.action == "discrete":
        scores = correction.astype(np.float64).copy()
        scores[int(base_action)] += 1.0
        return int(np.argmax(scores))
    a = np.asarray(base_action, dtype=np.float64).ravel() + correction
    return np.clip(a, mlp.low, mlp.high)


class ResidualPolicy:
    """A worker-side residual policy. The base program's module is executed afresh for each episode
    unless it defines its own ``reset`` (as for a program policy, state never leaks between episodes)."""

    def __init__(self, source: str, correction: MLP) -> None:
        self.code = compile(source, "<policy>", "exec")
        self.correction = correction
        self.base: Any = None

    def reset(self, params: Mapping[str, Any], seed: int) -> None:
        if self.base is None or not hasattr(self.base, "reset"):
            self.base = compile_policy(self.code, "<policy>")
        bind_spaces(self.base, getattr(self, "OBSERVATION_SPACE", None), getattr(self, "ACTION_SPACE", None))
        if hasattr(self.base, "reset"):
            self.base.reset(params, seed)

    def act(self, observation: Any, params: Mapping[str, Any]) -> Any:
        return combine(self.base.act(observation, params), self.correction.output(observation), self.correction)


def build(source: str, artifacts: Mapping[str, bytes]) -> ResidualPolicy:
    """Worker entry point (see :func:`ratchet.policies.build`): role ``"correction"``."""
    return ResidualPolicy(source, load_weights(artifacts["correction"]))
