"""Rolling policies out in a fitted world model instead of the env ("imagined" episodes), batched over start states.

Each member of the ensemble rolls every start state forward on its own (PETS's "TS-∞" trajectory sampling: K. Chua et
al., NeurIPS 2018), so the spread of the members' returns is the model's uncertainty about the candidate. This module
calls the policy's ``act``: it runs where policy code may run (a sandboxed job), never in the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ratchet.worldmodel.model import WorldModel

__all__ = ["action_encoder", "imagined_returns"]


def action_encoder(action_space: Any) -> Callable[[Any], np.ndarray]:
    """``action -> (d_act,)`` floats as transitions store it: Discrete one-hot, Box flattened and clipped to its bounds
    (as ``action_mode = "clip"`` would; a real episode with ``"error"`` would end instead)."""
    n = getattr(action_space, "n", None)
    if n is not None:
        start = int(getattr(action_space, "start", 0))

        def one_hot(a: Any) -> np.ndarray:
            out = np.zeros(int(n))
            out[(int(np.asarray(a).ravel()[0]) - start) % int(n)] = 1.0
            return out

        return one_hot
    low, high = np.asarray(action_space.low, np.float64).ravel(), np.asarray(action_space.high, np.float64).ravel()

    def box(a: Any) -> np.ndarray:
        x = np.asarray(a, np.float64).ravel()
        return np.clip(np.where(np.isfinite(x), x, 0.0), low, high)

    return box


def imagined_returns(model: WorldModel, act: Callable[[Any, Mapping[str, Any]], Any], params: Sequence[Mapping[str, Any]],
                     starts: np.ndarray, horizon: int, encode: Callable[[Any], np.ndarray]) -> np.ndarray:
    """Each candidate's mean imagined return over ``starts``, per ensemble member.

    An imagined episode ends at ``horizon`` steps or when the member predicts termination (probability > 0.5).

    Args:
        model: The fitted ensemble.
        act: The policy's ``act(observation, params)`` (one observation at a time).
        params: Each candidate's parameter values.
        starts: ``(b, d_obs)`` start observations.
        horizon: Most imagined steps per episode (≥ 1).
        encode: :func:`action_encoder` of the task's action space.

    Returns:
        ``(len(params), model.members)`` mean return over the start states.

    Raises:
        Whatever the policy's ``act`` raises (the caller's job fails: the screen then ranks nothing).
    """
    out = np.zeros((len(params), model.members))
    for c, p in enumerate(params):
        for m in range(model.members):
            obs = np.asarray(starts, np.float64).copy()
            alive = np.ones(len(obs), bool)
            total = np.zeros(len(obs))
            for _ in range(int(horizon)):
                idx = np.flatnonzero(alive)
                if not len(idx):
                    break
                actions = np.stack([encode(act(obs[i].astype(np.float32), p)) for i in idx])
                nxt, reward, p_end = model.predict(obs[idx], actions, m)
                total[idx] += np.where(np.isfinite(reward), reward, 0.0)
                obs[idx] = np.where(np.isfinite(nxt), nxt, obs[idx])
                alive[idx[p_end > 0.5]] = False
            out[c, m] = float(total.mean())
    return out
