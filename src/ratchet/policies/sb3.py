"""``sb3`` policies: a Stable-Baselines3 model (``.zip``, role ``"model"``), acted deterministically.

An SB3 zip holds a JSON ``data`` member (hyperparameters; some values are cloudpickled) and PyTorch
state dicts. Unpickling runs code, so the model is loaded only here, in a sandboxed worker (or a
sandboxed training job), never in the driver. :func:`algorithm_of` reads which algorithm wrote a zip
from its ``data`` JSON alone (no unpickling), so the driver may call it too.

Acting is ``model.policy.predict(observation, deterministic=True)``: the mode of the action
distribution (``argmax`` for Discrete, the mean clipped — or unsquashed for SAC/TD3 — for Box), under
``torch.no_grad`` with one torch thread.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from typing import Any

from ratchet.errors import PolicyError
from ratchet.npz import NpzError, check_zip

__all__ = ["ALGORITHMS", "SB3Policy", "algorithm_of", "build", "describe", "load_model", "load_vecnormalize"]

#: Algorithms whose zips this kind loads, by name (the Stable-Baselines3 class of the same name).
ALGORITHMS = ("PPO", "A2C", "SAC", "TD3")


#: Most bytes the ``data`` JSON member of a model zip may unpack to when the driver reads it.
_MAX_DATA_MEMBER = 16 * 2**20


def _data(data: bytes) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if z.getinfo("data").file_size > _MAX_DATA_MEMBER:
                raise PolicyError(f"a Stable-Baselines3 model archive whose 'data' member unpacks to "
                                  f"{z.getinfo('data').file_size:,} bytes (at most {_MAX_DATA_MEMBER:,})")
            check_zip(data)
            return json.loads(z.read("data"))
    except NpzError as exc:
        raise PolicyError(f"not a Stable-Baselines3 model archive: {exc}") from None
    except PolicyError:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: a missing member, bad JSON, an unknown method, ...
        raise PolicyError(f"not a Stable-Baselines3 model archive (its 'data' member: {type(exc).__name__})") from None


def algorithm_of(data: bytes) -> str:
    """Which algorithm saved the zip, read from its ``data`` JSON without unpickling anything.

    SB3 stores the policy class (its module names the algorithm for SAC and TD3) and the algorithm's
    attributes; PPO and A2C share ``ActorCriticPolicy`` and differ by PPO's ``clip_range``.

    Returns:
        One of :data:`ALGORITHMS`.

    Raises:
        PolicyError: not an SB3 zip, or an algorithm other than PPO, A2C, SAC, TD3.
    """
    d = _data(data)
    policy = d.get("policy_class")
    module = str(policy.get("__module__", "")) if isinstance(policy, dict) else ""
    for algo in ("sac", "td3"):
        if f"stable_baselines3.{algo}." in module:
            return algo.upper()
    if "stable_baselines3.common.policies" in module or "stable_baselines3.ppo" in module or "stable_baselines3.a2c" in module:
        if "clip_range" in d:
            return "PPO"
        if "gae_lambda" in d:
            return "A2C"
    raise PolicyError(f"a Stable-Baselines3 model of an unsupported algorithm (policy class from "
                      f"{module or 'an unknown module'!r}); supported: {', '.join(ALGORITHMS)}")


def _torch_single_thread() -> None:
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only settable before the first parallel work; harmless when already set
        pass


def algorithm_class(name: str) -> Any:
    import stable_baselines3

    return getattr(stable_baselines3, name)


def load_model(data: bytes, env: Any = None, **kwargs: Any) -> Any:
    """Load a zip with its own algorithm class on the CPU (unpickles: call only inside a sandbox).

    Args:
        data: The zip's bytes.
        env: An environment to attach (for training), or None.
        **kwargs: Passed to ``<Algorithm>.load`` (``custom_objects``, attributes to override).

    Raises:
        PolicyError: not a zip of a supported algorithm; whatever SB3 raises loading it.
    """
    _torch_single_thread()
    algo = algorithm_of(data)
    return algorithm_class(algo).load(io.BytesIO(data), env=env, device="cpu", **kwargs)


#: Schedules are cloudpickled functions; acting does not need them, so they are never unpickled here.
_ACTING_OBJECTS = {"learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0,
                   "clip_range_vf": None, "exploration_schedule": lambda _: 0.0}


def load_vecnormalize(data: bytes) -> Any:
    """The ``VecNormalize`` wrapper saved by ``VecNormalize.save`` (unpickles: call only inside a sandbox), with no
    environment attached (``set_venv`` attaches one), frozen: ``training`` False, so its statistics stay as saved.

    Raises:
        PolicyError: the bytes are not a VecNormalize.
    """
    import pickle

    from stable_baselines3.common.vec_env import VecNormalize

    vn = pickle.loads(data)
    if not isinstance(vn, VecNormalize):
        raise PolicyError(f"the normalization file holds a {type(vn).__name__}, not a VecNormalize")
    vn.training = False
    return vn


class SB3Policy:
    """A worker-side ``sb3`` policy: deterministic, stateless (recurrent policies are not supported).

    Args:
        model: The loaded model.
        vecnormalize: The model's frozen ``VecNormalize`` (observations go through its ``normalize_obs``
            before the policy sees them), or None.
    """

    def __init__(self, model: Any, vecnormalize: Any = None) -> None:
        from gymnasium import spaces

        self.model, self.vecnormalize = model, vecnormalize
        self.policy = model.policy
        self.policy.set_training_mode(False)
        self.discrete = isinstance(model.action_space, spaces.Discrete)

    def reset(self, params: Mapping[str, Any], seed: int) -> None:
        pass

    def act(self, observation: Any, params: Mapping[str, Any]) -> Any:
        if self.vecnormalize is not None:
            observation = self.vecnormalize.normalize_obs(observation)
        action, _ = self.policy.predict(observation, deterministic=True)  # no_grad inside
        return int(action) if self.discrete else action

    def act_batch(self, observations: Any, params: Mapping[str, Any]) -> list[Any]:
        """A lockstep round's actions, one ``predict`` per observation: PyTorch's matrix product of a batch rounds
        differently from a single row's, so one forward pass for all would change actions from what the model gives
        each observation alone (and from Stable-Baselines3's own loop); the round trip per step is saved all the
        same."""
        return [self.act(o, params) for o in observations]


def build(source: str, artifacts: Mapping[str, bytes]) -> SB3Policy:
    """Worker entry point (see :func:`ratchet.policies.build`): roles ``"model"`` and, optionally,
    ``"vecnormalize"``."""
    vn = load_vecnormalize(artifacts["vecnormalize"]) if "vecnormalize" in artifacts else None
    return SB3Policy(load_model(artifacts["model"], custom_objects=_ACTING_OBJECTS), vn)


def describe(data: bytes) -> str:
    """One line about a model zip, from its JSON alone: algorithm, policy class, spaces' summary."""
    d = _data(data)
    policy = d.get("policy_class")
    name = policy.get("__name__", "?") if isinstance(policy, dict) else "?"
    steps = d.get("num_timesteps")
    return f"sb3 {algorithm_of(data)} {name}" + (f", trained {int(steps):,} env steps" if isinstance(steps, int) else "")
