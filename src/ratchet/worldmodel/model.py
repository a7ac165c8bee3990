"""An ensemble of small networks that predicts what a step does: the change of the observation, the reward and
whether the episode terminates.

Fitting uses PyTorch on CPU (one thread, seeded: the same data and seed give the same weights); the fitted model is
plain NumPy arrays (:class:`WorldModel`), so predicting needs no PyTorch and runs anywhere, the sandbox included.
Each member is fitted on its own bootstrap sample of the training rows, as in PETS (K. Chua et al., "Deep
Reinforcement Learning in a Handful of Trials using Probabilistic Dynamics Models", NeurIPS 2018) and MBPO
(M. Janner et al., "When to Trust Your Model: Model-Based Policy Optimization", NeurIPS 2019): their disagreement
is the model's uncertainty about what it has not seen.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ratchet.npz import NpzError, load_npz
from ratchet.worldmodel.transitions import Transitions

__all__ = ["Fit", "WorldModel", "WorldModelError", "fit_model", "held_out", "score"]


class WorldModelError(ValueError):
    """Bytes that are not a model :meth:`WorldModel.to_bytes` writes (one line)."""


@dataclass(frozen=True)
class Fit:
    """How well a fitted model predicts.

    Attributes:
        rows: Transitions it was fitted on (training rows; held-out rows excluded).
        holdout: Held-out transitions it was scored on.
        holdout_error: Mean squared error of the ensemble mean on the held-out rows, of the next observation's change
            and the reward in units of their standard deviations (0: perfect; about 1: no better than the mean).
        reward_error: The reward's part of it (same units).
        disagreement: Mean standard deviation across members of the predicted change and reward on the held-out rows
            (same units): the model's uncertainty.
    """

    rows: int
    holdout: int
    holdout_error: float
    reward_error: float
    disagreement: float

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready form."""
        return {"rows": self.rows, "holdout": self.holdout, "holdout_error": self.holdout_error,
                "reward_error": self.reward_error, "disagreement": self.disagreement}


@dataclass(frozen=True)
class WorldModel:
    """A fitted ensemble, as arrays.

    Attributes:
        layers: Per member, ``(weight, bias)`` per layer (``weight`` ``(out, in)``), tanh between layers. The last
            layer's outputs are the normalised change of the observation (``d_obs``), the normalised reward (1) and
            the termination logit (1).
        x_mean, x_std: Input normalisation (observation then encoded action), ``(d_obs + d_act,)``.
        y_mean, y_std: Output scale of the change and the reward, ``(d_obs + 1,)``.
    """

    layers: tuple[tuple[tuple[np.ndarray, np.ndarray], ...], ...]
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: np.ndarray
    y_std: np.ndarray

    @property
    def members(self) -> int:
        """Networks in the ensemble."""
        return len(self.layers)

    @property
    def d_obs(self) -> int:
        """Observation width."""
        return int(self.y_mean.shape[0]) - 1

    def predict(self, obs: np.ndarray, action: np.ndarray, member: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step of one member.

        Args:
            obs: ``(b, d_obs)`` observations.
            action: ``(b, d_act)`` encoded actions (:func:`ratchet.worldmodel.transitions.action_width`).
            member: Which network, ``0 <= member < members``.

        Returns:
            ``(next_obs (b, d_obs), reward (b,), p_terminated (b,))``.
        """
        h = (np.concatenate([obs, action], axis=1) - self.x_mean) / self.x_std
        net = self.layers[member]
        for i, (w, b) in enumerate(net):
            h = h @ w.T + b
            if i < len(net) - 1:
                h = np.tanh(h)
        d = self.d_obs
        y = h[:, :d + 1] * self.y_std + self.y_mean
        p = 1.0 / (1.0 + np.exp(-np.clip(h[:, d + 1], -30, 30)))
        return obs + y[:, :d], y[:, d], p

    def to_bytes(self) -> bytes:
        """The ``.npz`` (no pickles) :meth:`from_bytes` reads."""
        arrays = {"x_mean": self.x_mean, "x_std": self.x_std, "y_mean": self.y_mean, "y_std": self.y_std}
        for m, net in enumerate(self.layers):
            for i, (w, b) in enumerate(net):
                arrays[f"m{m}_w{i}"], arrays[f"m{m}_b{i}"] = w, b
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> WorldModel:
        """Read a model (bounded unpacking, no pickles; shapes and finiteness checked).

        Raises:
            WorldModelError: one line saying what is wrong.
        """
        try:
            a = load_npz(data)
        except NpzError as exc:
            raise WorldModelError(str(exc)) from None
        try:
            norms = [np.asarray(a.pop(k), np.float64) for k in ("x_mean", "x_std", "y_mean", "y_std")]
            members = sorted({int(k[1:].split("_")[0]) for k in a})
            depth = len([k for k in a if k.startswith("m0_w")])
            layers = tuple(tuple((np.asarray(a[f"m{m}_w{i}"], np.float64), np.asarray(a[f"m{m}_b{i}"], np.float64))
                                 for i in range(depth)) for m in members)
        except (KeyError, ValueError) as exc:
            raise WorldModelError(f"not a world model ({type(exc).__name__}: {exc})") from None
        model = cls(layers, *norms)
        if not layers or members != list(range(len(members))) or 2 * depth * len(members) != len(a):
            raise WorldModelError("not a world model (members or layers missing)")
        if not all(np.isfinite(x).all() for x in [*norms, *(t for net in layers for wb in net for t in wb)]):
            raise WorldModelError("a world model with non-finite numbers")
        try:
            model.predict(np.zeros((1, model.d_obs)), np.zeros((1, model.x_mean.shape[0] - model.d_obs)), 0)
            for m in range(model.members):
                model.predict(np.zeros((1, model.d_obs)), np.zeros((1, model.x_mean.shape[0] - model.d_obs)), m)
        except ValueError as exc:
            raise WorldModelError(f"a world model whose shapes do not fit together ({exc})") from None
        return model


def fit_model(data: Transitions, *, members: int = 5, hidden: int = 64, updates: int = 300, batch: int = 256,
              holdout: float = 0.2, seed: int = 0) -> tuple[WorldModel, Fit]:
    """Fit an ensemble on ``data`` with PyTorch (CPU, one thread, seeded: deterministic).

    Every ``1/holdout``-th row (by a seeded permutation) is held out to score the model; each member trains on its own
    bootstrap sample of the rest, ``updates`` Adam steps of ``batch`` rows, two hidden layers of ``hidden`` units.

    Args:
        data: At least 10 transitions.
        members: Networks in the ensemble (≥ 1).
        hidden: Units per hidden layer.
        updates: Gradient steps per member.
        batch: Rows per step.
        holdout: Share of rows held out, in (0, 0.5].
        seed: Seed of the split, the bootstrap samples and the initial weights.

    Returns:
        ``(model, fit)``.

    Raises:
        ValueError: fewer than 10 transitions.
    """
    import torch

    n = len(data)
    if n < 10:
        raise ValueError(f"{n} transitions (a model needs at least 10)")
    rng = np.random.default_rng(seed)
    hold, train = held_out(n, holdout, rng)
    x = np.concatenate([data.obs, data.action], axis=1).astype(np.float64)
    y = np.concatenate([data.next_obs - data.obs, data.reward[:, None]], axis=1).astype(np.float64)
    done = data.terminated.astype(np.float64)
    x_mean, x_std = x[train].mean(0), x[train].std(0) + 1e-6
    y_mean, y_std = y[train].mean(0), y[train].std(0) + 1e-6
    xn, yn = (x - x_mean) / x_std, (y - y_mean) / y_std
    d_in, d_out = x.shape[1], y.shape[1] + 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        xt, yt, dt = (torch.as_tensor(a, dtype=torch.float32) for a in (xn, yn, done))
        nets = []
        for _ in range(members):
            boot = torch.as_tensor(rng.choice(train, size=len(train)), dtype=torch.long)
            net = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                      torch.nn.Tanh(), torch.nn.Linear(hidden, d_out))
            opt = torch.optim.Adam(net.parameters(), lr=3e-3)
            for _ in range(updates):
                idx = boot[torch.as_tensor(rng.integers(0, len(boot), size=min(batch, len(boot))), dtype=torch.long)]
                out = net(xt[idx])
                loss = ((out[:, :-1] - yt[idx]) ** 2).mean() + 0.1 * torch.nn.functional.binary_cross_entropy_with_logits(
                    out[:, -1], dt[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            nets.append(tuple((m.weight.detach().double().numpy().copy(), m.bias.detach().double().numpy().copy())
                              for m in net if isinstance(m, torch.nn.Linear)))
    finally:
        torch.set_num_threads(threads)
    model = WorldModel(tuple(nets), x_mean, x_std, y_mean, y_std)
    return model, score(model, data, hold, len(train))


def held_out(n: int, holdout: float, rng: np.random.Generator | int) -> tuple[np.ndarray, np.ndarray]:
    """``(held-out rows, training rows)`` of ``n`` transitions: a seeded permutation's first ``holdout`` share (at
    least 2 rows) is held out. An int ``rng`` is a seed (as :func:`fit_model` draws it first from its seed)."""
    order = np.random.default_rng(rng).permutation(n) if isinstance(rng, int) else rng.permutation(n)
    n_hold = max(2, round(n * holdout))
    return order[:n_hold], order[n_hold:]


def score(model: WorldModel, data: Transitions, rows: np.ndarray, trained_on: int = 0) -> Fit:
    """How well ``model`` predicts the transitions ``rows`` of ``data`` (:class:`Fit`; numbers in units of the
    model's own output scale). Runs anywhere (NumPy only): the driver scores a model on its own held-out rows.

    Raises:
        ValueError: the data's widths do not fit the model.
    """
    obs, act = data.obs[rows].astype(np.float64), data.action[rows].astype(np.float64)
    target = (np.concatenate([data.next_obs[rows] - data.obs[rows], data.reward[rows, None]], axis=1)
              - model.y_mean) / model.y_std
    preds = []
    for m in range(model.members):
        nxt, r, _ = model.predict(obs, act, m)
        preds.append((np.concatenate([nxt - obs, r[:, None]], axis=1) - model.y_mean) / model.y_std)
    stack = np.stack(preds)
    err = (stack.mean(0) - target) ** 2
    return Fit(trained_on, len(rows), float(err.mean()), float(err[:, -1].mean()),
               float(stack.std(0).mean()) if model.members > 1 else 0.0)
