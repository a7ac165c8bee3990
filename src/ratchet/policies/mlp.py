"""``mlp`` policies: a feed-forward network whose weights are data, evaluated with NumPy.

The weights are one ``.npz`` artifact (role ``"weights"``), read with ``allow_pickle=False``, so the
driver may open it too. Arrays: ``W0, b0, …, W{k}, b{k}`` (``W{i}`` of shape ``(in, out)``, float64),
``obs_shift`` and ``obs_scale`` (observation normalisation ``x = (obs - shift) * scale``), ``log_std``
(a Box policy's exploration noise, kept for RL refiners; unused when acting), and ``meta`` (JSON as
uint8: ``activation`` ``"tanh"``/``"relu"``, ``action`` ``"discrete"`` or ``"box"``, ``low``/``high``).

Acting is deterministic: ``argmax`` of the output for a Discrete action space, the output clipped to the
space's bounds for a Box one — the same network and mapping as a Stable-Baselines3 ``MlpPolicy``'s
actor (``mlp_extractor.policy_net`` then ``action_net``) with ``deterministic=True``, so RL refiners
train it with SB3 by copying weights in and out (:func:`to_sb3_actor`, :func:`from_sb3_actor`).
Initialisation follows SB3 (orthogonal, gain √2 for hidden layers and 0.01 for the output layer;
Andrychowicz et al., "What Matters in On-Policy RL", 2020).
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ratchet.errors import PolicyError
from ratchet.npz import NpzError, load_npz

__all__ = ["ACTIVATIONS", "MLP", "build", "from_sb3_actor", "init_weights", "load_weights", "to_sb3_actor"]

ACTIVATIONS = ("tanh", "relu")


@dataclass(frozen=True)
class MLP:
    """A loaded network.

    Attributes:
        weights: ``[(W0, b0), …]``, ``W`` of shape ``(in, out)``, float64.
        obs_shift, obs_scale: Observation normalisation, shape ``(obs_dim,)``.
        log_std: Shape ``(act_dim,)`` for a Box action, else ``(0,)``.
        activation: ``"tanh"`` or ``"relu"`` (between hidden layers; the output is linear).
        action: ``"discrete"`` or ``"box"``.
        low, high: A Box action space's bounds (flattened), else None.
    """

    weights: tuple[tuple[np.ndarray, np.ndarray], ...]
    obs_shift: np.ndarray
    obs_scale: np.ndarray
    log_std: np.ndarray
    activation: str
    action: str
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    @property
    def hidden(self) -> list[int]:
        return [int(w.shape[1]) for w, _ in self.weights[:-1]]

    def output(self, observation: Any) -> np.ndarray:
        """The network's output for one observation (flattened), shape ``(out,)``: row 0 of :meth:`outputs`."""
        return self.outputs(np.asarray(observation, dtype=np.float64).reshape(1, -1))[0]

    def outputs(self, observations: Any) -> np.ndarray:
        """The network's outputs for ``n`` observations (each flattened), shape ``(n, out)``, float64.

        Each row is computed as a vector-matrix product of its own (a stack of ``(1, in) @ (in, out)``), never as
        one matrix product of the whole batch, whose summation order BLAS may choose by the batch's size: a row's
        output is the same bits whichever observations it came with, and alone.
        """
        x = (np.asarray(observations, dtype=np.float64).reshape(len(observations), 1, -1) - self.obs_shift) * self.obs_scale
        act = np.tanh if self.activation == "tanh" else (lambda v: np.maximum(v, 0.0))
        for i, (w, b) in enumerate(self.weights):
            x = x @ w + b
            if i < len(self.weights) - 1:
                x = act(x)
        return x[:, 0, :]

    def act(self, observation: Any) -> Any:
        """The deterministic action: an ``int`` for Discrete, a float array of the Box's shape otherwise."""
        out = self.output(observation)
        if self.action == "discrete":
            return int(np.argmax(out))
        return np.clip(out, self.low, self.high)

    def act_batch(self, observations: Any) -> np.ndarray:
        """:meth:`act` for ``n`` observations at once: int64 shape ``(n,)`` for Discrete, else float64 ``(n, act)``."""
        out = self.outputs(observations)
        if self.action == "discrete":
            return np.argmax(out, axis=1)
        return np.clip(out, self.low, self.high)

    def to_bytes(self) -> bytes:
        """The ``.npz`` artifact (deterministic bytes for equal weights)."""
        meta = {"activation": self.activation, "action": self.action,
                "low": None if self.low is None else self.low.tolist(),
                "high": None if self.high is None else self.high.tolist()}
        arrays: dict[str, np.ndarray] = {"meta": np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8),
                                         "obs_shift": self.obs_shift, "obs_scale": self.obs_scale,
                                         "log_std": self.log_std}
        for i, (w, b) in enumerate(self.weights):
            arrays[f"W{i}"], arrays[f"b{i}"] = w, b
        buf = io.BytesIO()
        # uncompressed: zip entries carry fixed timestamps in NumPy's writer. The ignore: NumPy's stub types **kwds
        # as if a key could be its allow_pickle (a bool); these keys are meta, obs_*, log_std, W<i>, b<i>.
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    def with_weights(self, weights: Sequence[tuple[np.ndarray, np.ndarray]], log_std: np.ndarray | None = None) -> MLP:
        """A copy with other weights (same shapes) and optionally another ``log_std``."""
        new = tuple((np.array(w, dtype=np.float64), np.array(b, dtype=np.float64)) for w, b in weights)
        if [(w.shape, b.shape) for w, b in new] != [(w.shape, b.shape) for w, b in self.weights]:
            raise PolicyError("new weights do not have the network's shapes")
        ls = self.log_std if log_std is None else np.array(log_std, dtype=np.float64).reshape(self.log_std.shape)
        return MLP(new, self.obs_shift, self.obs_scale, ls, self.activation, self.action, self.low, self.high)


def _space_info(observation_space: Any, action_space: Any) -> tuple[int, np.ndarray, np.ndarray, str, int, Any, Any]:
    from gymnasium import spaces

    if not isinstance(observation_space, spaces.Box):
        raise PolicyError(f"an mlp policy needs a Box observation space, got {type(observation_space).__name__}")
    lo = np.asarray(observation_space.low, dtype=np.float64).ravel()
    hi = np.asarray(observation_space.high, dtype=np.float64).ravel()
    if isinstance(action_space, spaces.Discrete):
        return lo.size, lo, hi, "discrete", int(action_space.n), None, None
    if isinstance(action_space, spaces.Box):
        alo = np.asarray(action_space.low, dtype=np.float64).ravel()
        ahi = np.asarray(action_space.high, dtype=np.float64).ravel()
        return lo.size, lo, hi, "box", alo.size, alo, ahi
    raise PolicyError(f"an mlp policy needs a Discrete or Box action space, got {type(action_space).__name__}")


def _orthogonal(rng: np.random.Generator, n_in: int, n_out: int, gain: float) -> np.ndarray:
    a = rng.standard_normal((max(n_in, n_out), min(n_in, n_out)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    w = q if n_in >= n_out else q.T
    return gain * w[:n_in, :n_out]


def init_weights(observation_space: Any, action_space: Any, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh", normalize: str = "bounds", seed: int = 0,
                 zero_output: bool = False, log_std_init: float = 0.0) -> MLP:
    """A fresh network for the task's spaces.

    Args:
        observation_space: A Gymnasium Box.
        action_space: Discrete or Box.
        hidden: Hidden layer sizes.
        activation: ``"tanh"`` or ``"relu"``.
        normalize: ``"bounds"`` (map finite observation bounds to [-1, 1]; unbounded dimensions pass
            through) or ``"none"``.
        seed: Seeds the initial weights.
        zero_output: Output layer exactly zero (a residual correction that starts as no correction).
        log_std_init: Initial ``log_std`` of a Box policy.

    Raises:
        PolicyError: unsupported spaces or settings.
    """
    if activation not in ACTIVATIONS:
        raise PolicyError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if normalize not in ("bounds", "none"):
        raise PolicyError(f"observation normalisation must be \"bounds\" or \"none\", got {normalize!r}")
    n_obs, lo, hi, action, n_out, alo, ahi = _space_info(observation_space, action_space)
    shift, scale = np.zeros(n_obs), np.ones(n_obs)
    if normalize == "bounds":
        finite = np.isfinite(lo) & np.isfinite(hi) & (hi > lo) & (hi - lo < 1e6)
        shift[finite] = (hi[finite] + lo[finite]) / 2
        scale[finite] = 2.0 / (hi[finite] - lo[finite])
    rng = np.random.default_rng(seed)
    sizes = [n_obs, *[int(h) for h in hidden], n_out]
    weights = []
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        gain = 0.0 if (last and zero_output) else (0.01 if last else np.sqrt(2))
        weights.append((_orthogonal(rng, sizes[i], sizes[i + 1], gain) if gain else np.zeros((sizes[i], sizes[i + 1])),
                        np.zeros(sizes[i + 1])))
    log_std = np.full(n_out, float(log_std_init)) if action == "box" else np.zeros(0)
    return MLP(tuple(weights), shift, scale, log_std, activation, action, alo, ahi)


def load_weights(data: bytes) -> MLP:
    """Read an ``.npz`` artifact (no pickles; at most :func:`ratchet.npz.unpack_limit` bytes unpacked).

    Raises:
        PolicyError: not a valid mlp artifact, or one that unpacks to more than the driver loads.
    """
    try:
        arrays = load_npz(data)
    except NpzError as exc:
        raise PolicyError(f"not an mlp weights artifact: {exc}") from None
    try:
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        n = sum(1 for k in arrays if k.startswith("W"))
        weights = tuple((arrays[f"W{i}"].astype(np.float64), arrays[f"b{i}"].astype(np.float64)) for i in range(n))
        low = None if meta.get("low") is None else np.asarray(meta["low"], dtype=np.float64)
        high = None if meta.get("high") is None else np.asarray(meta["high"], dtype=np.float64)
        mlp = MLP(weights, arrays["obs_shift"].astype(np.float64), arrays["obs_scale"].astype(np.float64),
                  arrays["log_std"].astype(np.float64), str(meta["activation"]), str(meta["action"]), low, high)
    except PolicyError:
        raise
    except Exception as exc:  # noqa: BLE001 - an untrusted artifact: every failure is a PolicyError
        raise PolicyError(f"not an mlp weights artifact: {type(exc).__name__}: {exc}"[:300]) from None
    if not weights or mlp.activation not in ACTIVATIONS or mlp.action not in ("discrete", "box"):
        raise PolicyError("not an mlp weights artifact: no layers, or unknown activation/action")
    for (w, b), (w2, _) in itertools.pairwise(weights):
        if w.ndim != 2 or b.shape != (w.shape[1],) or w2.shape[0] != w.shape[1]:
            raise PolicyError("not an mlp weights artifact: layer shapes do not chain")
    arrays_of = [a for wb in weights for a in wb] + [mlp.obs_shift, mlp.obs_scale, mlp.log_std]
    if not all(np.isfinite(a).all() for a in arrays_of):
        raise PolicyError("not an mlp weights artifact: some weights are NaN or infinite")
    return mlp


def _actor_layers(policy: Any) -> list[Any]:
    from torch import nn

    layers = [m for m in policy.mlp_extractor.policy_net if isinstance(m, nn.Linear)] + [policy.action_net]
    return layers


def to_sb3_actor(mlp: MLP, policy: Any, log_std: bool = True) -> None:
    """Copy ``mlp``'s weights into an SB3 ``ActorCriticPolicy``'s actor: the Linear layers of
    ``mlp_extractor.policy_net``, then ``action_net`` (and ``log_std`` for a Box network when
    ``log_std``). The critic is left as it is.

    Raises:
        PolicyError: the policy's actor does not have the network's layer shapes.
    """
    import torch

    layers = _actor_layers(policy)
    if [tuple(lin.weight.shape) for lin in layers] != [(w.shape[1], w.shape[0]) for w, _ in mlp.weights]:
        raise PolicyError(f"the SB3 actor's layers {[tuple(lin.weight.shape) for lin in layers]} do not match the "
                          f"network's {[(w.shape[1], w.shape[0]) for w, _ in mlp.weights]}")
    with torch.no_grad():
        for lin, (w, b) in zip(layers, mlp.weights):
            lin.weight.copy_(torch.as_tensor(w.T, dtype=lin.weight.dtype))
            lin.bias.copy_(torch.as_tensor(b, dtype=lin.bias.dtype))
        if log_std and mlp.log_std.size and getattr(policy, "log_std", None) is not None:
            policy.log_std.copy_(torch.as_tensor(mlp.log_std, dtype=policy.log_std.dtype))


def from_sb3_actor(mlp: MLP, policy: Any) -> MLP:
    """``mlp`` with the weights (and, for a Box network, ``log_std``) of an SB3 policy's actor
    (the inverse of :func:`to_sb3_actor`; float32 values widened to float64)."""
    weights = [(lin.weight.detach().cpu().numpy().astype(np.float64).T, lin.bias.detach().cpu().numpy().astype(np.float64))
               for lin in _actor_layers(policy)]
    ls = getattr(policy, "log_std", None)
    log_std = ls.detach().cpu().numpy().astype(np.float64) if mlp.log_std.size and ls is not None else None
    return mlp.with_weights(weights, log_std)


class MLPPolicy:
    """A worker-side ``mlp`` policy: deterministic, stateless."""

    def __init__(self, mlp: MLP) -> None:
        self.mlp = mlp

    def reset(self, params: Mapping[str, Any], seed: int) -> None:
        pass

    def act(self, observation: Any, params: Mapping[str, Any]) -> Any:
        return self.mlp.act(observation)

    def act_batch(self, observations: Any, params: Mapping[str, Any]) -> Any:
        """One forward pass for a lockstep round's observations (:meth:`MLP.act_batch`)."""
        return self.mlp.act_batch(observations)


def build(source: str, artifacts: Mapping[str, bytes]) -> MLPPolicy:
    """Worker entry point (see :func:`ratchet.policies.build`): role ``"weights"``."""
    return MLPPolicy(load_weights(artifacts["weights"]))


def describe(data: bytes) -> str:
    """One line about a weights artifact: layer sizes, activation, parameter count, weight norm."""
    m = load_weights(data)
    sizes = [m.weights[0][0].shape[0]] + [w.shape[1] for w, _ in m.weights]
    count = sum(w.size + b.size for w, b in m.weights)
    norm = float(np.sqrt(sum(float((w ** 2).sum() + (b ** 2).sum()) for w, b in m.weights)))
    return f"mlp {'-'.join(map(str, sizes))} ({m.activation}, {m.action}): {count:,} weights, norm {norm:.4g}"


def difference(before: bytes, after: bytes) -> str:
    """One line on how far a network moved: the Euclidean norm of the change of all weights and biases and
    how many of them changed; ``"different shapes"`` when the networks do not match layer for layer."""
    a, b = load_weights(before), load_weights(after)
    if [(w.shape, v.shape) for w, v in a.weights] != [(w.shape, v.shape) for w, v in b.weights]:
        return "different shapes"
    diff = np.concatenate([np.concatenate([(w2 - w1).ravel(), (v2 - v1).ravel()])
                           for (w1, v1), (w2, v2) in zip(a.weights, b.weights)])
    return f"norm {float(np.linalg.norm(diff)):.4g} ({int(np.count_nonzero(diff)):,} of {diff.size:,} changed)"
