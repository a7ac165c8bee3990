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
        self.bases: dict[int, Any] = {}  # lockstep slots' bases

    def reset(self, params: Mapping[str, Any], seed: int) -> None:
        if self.base is None or not hasattr(self.base, "reset"):
            self.base = compile_policy(self.code, "<policy>")
        bind_spaces(self.base, getattr(self, "OBSERVATION_SPACE", None), getattr(self, "ACTION_SPACE", None))
        if hasattr(self.base, "reset"):
            self.base.reset(params, seed)

    def act(self, observation: Any, params: Mapping[str, Any]) -> Any:
        return combine(self.base.act(observation, params), self.correction.output(observation), self.correction)

    @property
    def sequential(self) -> bool:
        """The base program may draw from the global random generators: serve one episode at a time."""
        from ratchet.policy import uses_global_random

        return uses_global_random(self.code)

    def start_slot(self, slot: int, params: Mapping[str, Any], seed: int) -> None:
        """Start a lockstep batch's episode in ``slot``: a base of its own, started as :meth:`reset` starts one."""
        base = compile_policy(self.code, "<policy>")
        bind_spaces(base, getattr(self, "OBSERVATION_SPACE", None), getattr(self, "ACTION_SPACE", None))
        if hasattr(base, "reset"):
            base.reset(params, seed)
        self.bases[slot] = base

    def end_slot(self, slot: int) -> None:
        """The episode in ``slot`` ended: drop its base."""
        self.bases.pop(slot, None)

    def act_slots(self, slots: list[int], observations: Any, params: Mapping[str, Any]) -> list[Any]:
        """A lockstep round: each slot's base action (or the exception it raised) and the correction for all
        observations in one forward pass (:meth:`MLP.outputs`, row for row the same as alone)."""
        corrections = self.correction.outputs(observations)
        out: list[Any] = []
        for slot, obs, corr in zip(slots, observations, corrections):
            try:
                out.append(combine(self.bases[slot].act(obs, params), corr, self.correction))
            except Exception as exc:  # noqa: BLE001 - the base's failure is its own episode's outcome
                out.append(exc)
        return out


def build(source: str, artifacts: Mapping[str, bytes]) -> ResidualPolicy:
    """Worker entry point (see :func:`ratchet.policies.build`): role ``"correction"``."""
    return ResidualPolicy(source, load_weights(artifacts["correction"]))
