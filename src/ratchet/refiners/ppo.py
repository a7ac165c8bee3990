"""PPO refiners: fine-tune a network policy's weights with Stable-Baselines3's PPO, in sandboxed
training jobs, and propose the checkpoints it reaches; the gate decides, as for every candidate.

Two kinds (``[[refiners]]`` tables):

- ``ppo`` refines ``mlp`` and ``sb3`` policies. An ``mlp`` network's weights are copied into a PPO
  ``MlpPolicy`` actor of the same shape (``mlp_extractor.policy_net`` then ``action_net``, and
  ``log_std``); the critic is the parent's (artifact role ``"critic"``) when it has one, else fresh.
  An ``sb3`` zip is loaded with its own algorithm (PPO; A2C, SAC and TD3 zips are fine-tuned with their
  own algorithm and hyperparameters) and saved back as a zip.
- ``residual`` refines ``residual`` policies: PPO trains the correction network. The env PPO sees
  takes the correction as its action, asks the base program for its action on the same observation
  and steps the real env with ``clip(base + correction)`` (a Discrete action space: the base's action
  scores 1, the correction's scores are added, the best wins), so PPO learns only the residual
  (Silver et al., "Residual Policy Learning", 2018; Johannink et al., "Residual Reinforcement Learning
  for Robot Control", 2019). The base program runs inside the training sandbox.

Each generation is one training job: ``env_steps`` of PPO (rounded up to whole rollouts; the last job an
env-step budget affords is cut to what is left, see :meth:`PPORefiner.fit_training`), split into
``checkpoints`` equal parts; the policy after each part is a candidate. A job starts where the
refiner's previous job ended while the incumbent is on that line (so training accumulates across
generations, one long PPO run whose checkpoints are gated), and from the incumbent when another
refiner moved it. PPO
itself: Schulman et al., "Proximal Policy Optimization Algorithms", 2017 (SB3's implementation).
Training is reproducible: one torch thread, and torch, NumPy and the env seeded from the refiner's seed
(the run seed) and the job's training seeds, so a run seed reproduces its candidates; a resumed run
reads recorded jobs back instead of re-training.
"""

from __future__ import annotations

import hashlib
import io
import math
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ratchet.critic import Critique
from ratchet.execution.training import InfoField, Role, TrainingAnswer, TrainingJob, TrainingOutput
from ratchet.npz import check_zip, npz_headers
from ratchet.policies.mlp import load_weights
from ratchet.policy import Candidate
from ratchet.refiners.base import GenerationCost, Refiner

__all__ = ["KINDS", "PPORefiner", "PPOSettings", "ResidualSettings", "answer", "train"]


class PPOSettings(BaseModel):
    """Settings of a ``ppo`` refiner (a ``[[refiners]]`` table with ``kind = "ppo"``).

    Hyperparameters left at None keep a Stable-Baselines3 model's own values (``sb3`` policies) or take
    SB3's PPO defaults (``mlp`` and ``residual`` policies).
    """

    model_config = ConfigDict(extra="forbid")

    env_steps: int = Field(20_000, ge=1, le=10**9, description="Env steps of training per generation (one training "
                                                               "job), rounded up to whole rollouts of n_steps per checkpoint; "
                                                               "the last job an env-step budget affords may be cut "
                                                               "to what is left.",
                           json_schema_extra={"unit": "env steps"})
    checkpoints: int = Field(2, ge=1, le=100, description="Candidates per generation: the policy after each "
                                                          "1/checkpoints of the generation's training.",
                             json_schema_extra={"unit": "candidates"})
    seeds: int = Field(16, ge=1, le=100_000, description="Fresh training seeds per job; training episodes reset "
                                                         "through them in turn.",
                       json_schema_extra={"unit": "seeds"})
    n_steps: int = Field(1024, ge=2, le=1_000_000, description="Env steps per PPO rollout (one env).",
                         json_schema_extra={"unit": "env steps"})
    learning_rate: float | None = Field(None, gt=0, le=1, description="Adam step size (SB3 default 3e-4).")
    batch_size: int | None = Field(None, ge=2, le=1_000_000, description="Minibatch size (SB3 default 64).",
                                   json_schema_extra={"unit": "env steps"})
    n_epochs: int | None = Field(None, ge=1, le=1000, description="Passes over each rollout (SB3 default 10).",
                                 json_schema_extra={"unit": "passes"})
    gamma: float | None = Field(None, gt=0, le=1, description="Discount factor (SB3 default 0.99).")
    gae_lambda: float | None = Field(None, ge=0, le=1, description="GAE lambda (SB3 default 0.95).")
    clip_range: float | None = Field(None, gt=0, le=10, description="PPO clip range (SB3 default 0.2).")
    ent_coef: float | None = Field(None, ge=0, le=10, description="Entropy bonus (SB3 default 0).")
    vf_coef: float | None = Field(None, ge=0, le=10, description="Value-loss weight (SB3 default 0.5).")
    max_grad_norm: float | None = Field(None, gt=0, le=1e6, description="Gradient clipping (SB3 default 0.5).")
    log_std_init: float | None = Field(None, ge=-20, le=5, description="Log std of a Box policy's Gaussian each job "
                                                                      "starts from; None: the parent's.")
    critic_hidden: list[int] = Field(default_factory=lambda: [64, 64], description="Hidden layers of the value "
                                                                                 "network of mlp and residual policies.")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Base seed of training (torch, NumPy, env); each "
                                                                  "job mixes it with its training seeds. None: the "
                                                                  "run seed (plus the refiner's position).")

    @field_validator("critic_hidden")
    @classmethod
    def _critic(cls, v: list[int]) -> list[int]:
        if not 1 <= len(v) <= 8 or any(not 1 <= h <= 4096 for h in v):
            raise ValueError("1 to 8 hidden layers of 1 to 4096 units each")
        return v

    @model_validator(mode="after")
    def _batch(self) -> PPOSettings:
        if self.batch_size is not None and self.batch_size > self.n_steps:
            raise ValueError(f"batch_size ({self.batch_size}) must not exceed n_steps ({self.n_steps})")
        return self

    @property
    def checkpoint_env_steps(self) -> int:
        """Env steps between checkpoints: ``env_steps / checkpoints`` rounded up to whole rollouts."""
        return math.ceil(self.env_steps / self.checkpoints / self.n_steps) * self.n_steps

    @property
    def smallest_job_env_steps(self) -> int:
        """The smallest training job this refiner can run (one rollout, when the budget's last job is cut)."""
        return self.n_steps

    #: What to change when even :attr:`smallest_job_env_steps` does not fit the budget.
    smallest_job_hint: ClassVar[str] = "lower n_steps (one rollout) or raise [budget] env_steps"

    @property
    def job_env_steps(self) -> int:
        """Env steps of one generation's training job (charged to the budget in full)."""
        return self.checkpoint_env_steps * self.checkpoints


class ResidualSettings(PPOSettings):
    """Settings of a ``residual`` refiner: those of ``ppo``, with less exploration noise by default (the base
    policy already acts sensibly; a correction noise of std 1 would drown it)."""

    log_std_init: float | None = Field(-1.0, ge=-20, le=5, description="Log std of the correction's Gaussian each "
                                                                      "job starts from; None: the parent's.")


#: SB3's PPO defaults, used for mlp and residual policies where a setting is None.
_PPO_DEFAULTS = {"learning_rate": 3e-4, "batch_size": 64, "n_epochs": 10, "gamma": 0.99, "gae_lambda": 0.95,
                 "clip_range": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5}


class PPORefiner(Refiner):
    """Proposes the checkpoints of one PPO training job per generation, started from the incumbent.

    Args:
        settings: The table's settings.
        name: The arm name (its candidates' ``refiner``).
        ctx: The loop's :class:`~ratchet.refiners.registry.RefinerContext` (runs training jobs).
        trainer: The :data:`~ratchet.execution.training.TRAINERS` name (``"ppo"`` or ``"residual"``).
    """

    #: No distribution mean to recommend: a generation evaluates its checkpoints and the incumbent only.
    recommends = False

    def __init__(self, settings: PPOSettings, name: str, ctx: Any, trainer: str) -> None:
        self.settings, self.name, self.ctx, self.trainer = settings, name, ctx, trainer
        self._failure: str | None = None
        self._line: Candidate | None = None  # the last checkpoint of this refiner's training line
        self._line_ids: set[str] = set()  # the incumbents this line has started from or proposed
        self._fitted: tuple[int, int] | None = None  # (checkpoints, env steps) of a job cut to the budget's rest

    @property
    def population_size(self) -> int:
        """Candidates per generation: the job's checkpoints."""
        return self._fitted[0] if self._fitted else self.settings.checkpoints

    @property
    def training_env_steps(self) -> int:
        """Env steps the generation's training job takes."""
        return self._fitted[1] if self._fitted else self.settings.job_env_steps

    def generation_cost(self) -> GenerationCost:
        """The job's checkpoints, each a candidate, and its env steps of training (never a recommendation)."""
        return GenerationCost(proposals=self.population_size, training_env_steps=self.training_env_steps)

    def fit(self, room_env_steps: int) -> bool:
        """:meth:`fit_training`."""
        return self.fit_training(room_env_steps)

    def fit_training(self, room: int) -> bool:
        """Cut the next job to at most ``room`` env steps (whole rollouts of ``n_steps``, at most
        ``checkpoints`` parts), for the last generation an env-step budget affords: the budget is spent on
        training instead of being left over. Returns False (and cuts nothing) when not even one rollout fits.
        The cut applies to the next :meth:`propose` only."""
        n = self.settings.n_steps
        k = min(self.settings.checkpoints, room // n)
        if k < 1 or room >= self.settings.job_env_steps:
            return False
        self._fitted = (k, room // k // n * n * k)
        return True

    def idle_reason(self) -> str | None:
        """Why no more generations can be proposed: the last training job failed (None otherwise)."""
        return self._failure

    def job_seed(self, seeds: Sequence[int]) -> int:
        """The job's random seed: the base seed mixed with its training seeds (31 bits)."""
        base = self.settings.seed if self.settings.seed is not None else self.ctx.seed
        blob = f"{base}:{','.join(map(str, seeds))}".encode()
        return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") & 0x7FFFFFFF

    def start_of_job(self, incumbent: Candidate) -> Candidate:
        """Where the next job starts: the last checkpoint of this refiner's training line while the incumbent
        is on that line (the start it grew from, or one of its checkpoints), else the incumbent (another
        refiner promoted something: follow it). So training accumulates across generations, like one long
        PPO run whose checkpoints are gated, instead of restarting from the incumbent every generation."""
        if self._line is not None and incumbent.id in self._line_ids:
            return self._line
        self._line_ids = {incumbent.id}
        return incumbent

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """Train (in the sandbox, or read back from the ledger) from :meth:`start_of_job` of the incumbent
        ``parent`` and propose each checkpoint."""
        s = self.settings
        start = self.start_of_job(parent)
        seeds = tuple(self.ctx.training_seeds(s.seeds))
        settings = {**s.model_dump(mode="json"), "seed": self.job_seed(seeds)}
        if self._fitted:  # the budget's last job, cut to what is left
            settings.update(checkpoints=self._fitted[0], env_steps=self._fitted[1])
        job_steps, self._fitted = self.training_env_steps, None
        result = self.ctx.train(TrainingJob(self.trainer, start, settings, seeds, job_steps, answer=answer(start.kind)))
        if result.error is not None:
            self._failure = f"{self.name}: training failed: {' '.join(str(result.error).split())}"  # one line
            return []
        out: list[Candidate] = []
        for o in result.outputs:
            cand = Candidate.create(start.source, start.params, kind=start.kind,
                                    artifacts={**start.artifacts, **o.info["artifacts"]}, parent_id=start.id,
                                    refiner=self.name)
            if cand.id not in (parent.id, start.id) and all(c.id != cand.id for c in out):
                out.append(cand)
        if out:
            self._line = out[-1]
            self._line_ids |= {c.id for c in out}
        return out



# -- the trainer (runs in the sandbox) ---------------------------------------------------------------


def _seeded_reset(env: Any, seeds: Sequence[int]) -> Any:
    """``env`` whose resets go through ``seeds`` in turn (the seed SB3 passes is ignored)."""
    import gymnasium as gym

    class SeededReset(gym.Wrapper):
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self._i = 0

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            s = int(seeds[self._i % len(seeds)])
            self._i += 1
            return self.env.reset(seed=s, options=options)

    return SeededReset(env)


def _normalized(env: Any, net: Any) -> Any:
    """``env`` with the network's observation normalisation applied (flattened, float32), so SB3's actor
    sees what the :class:`~ratchet.policies.mlp.MLP` sees."""
    import gymnasium as gym

    shift, scale = net.obs_shift, net.obs_scale

    class Normalized(gym.ObservationWrapper):
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, shift.shape, np.float32)

        def observation(self, observation: Any) -> np.ndarray:
            x = (np.asarray(observation, dtype=np.float64).ravel() - shift) * scale
            return x.astype(np.float32)

    return Normalized(env)


def _residual_env(env: Any, seeds: Sequence[int], source: str, params: Mapping[str, Any], net: Any) -> Any:
    """The env PPO sees when it learns a correction: its action is the correction; the base program acts
    on the same observation and the real env steps with the combined action
    (:func:`ratchet.policies.residual.combine`)."""
    import gymnasium as gym

    from ratchet.policies.residual import combine
    from ratchet.policy import bind_spaces, compile_policy

    code = compile(source, "<policy>", "exec")
    inner_space = env.action_space
    n_out = net.weights[-1][0].shape[1]
    if net.action == "box":
        width = np.asarray(net.high, dtype=np.float64) - np.asarray(net.low, dtype=np.float64)
        space = gym.spaces.Box(-width.astype(np.float32), width.astype(np.float32), (n_out,), np.float32)
    else:  # scores added to the base action's score of 1: ±2 is enough to override it
        space = gym.spaces.Box(-2.0, 2.0, (n_out,), np.float32)

    class Residual(gym.Wrapper):
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self.action_space = space
            self._i, self._obs = 0, None
            self.base: Any = None  # the program policy, compiled at the first reset

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            s = int(seeds[self._i % len(seeds)])
            self._i += 1
            if self.base is None or not hasattr(self.base, "reset"):
                self.base = compile_policy(code, "<policy>")
            bind_spaces(self.base, self.env.observation_space, inner_space)
            if hasattr(self.base, "reset"):
                self.base.reset(dict(params), s)
            self._obs, info = self.env.reset(seed=s, options=options)
            return self._obs, info

        def step(self, action: Any) -> Any:
            base = self.base.act(self._obs, dict(params))
            a = combine(base, np.asarray(action, dtype=np.float64).ravel(), net)
            if net.action == "box":
                a = np.asarray(a, dtype=inner_space.dtype).reshape(inner_space.shape)
            obs, reward, terminated, truncated, info = self.env.step(a)
            self._obs = obs
            return obs, reward, terminated, truncated, info

    return Residual(env)


def _hyper(settings: Mapping[str, Any], fill: bool) -> dict[str, Any]:
    """The PPO hyperparameters set (``fill``: None replaced by SB3's defaults, else left out)."""
    out = {}
    for k, default in _PPO_DEFAULTS.items():
        v = settings.get(k)
        if v is not None or fill:
            out[k] = default if v is None else v
    return out


def _critic_bytes(policy: Any) -> bytes:
    arrays = {k: v.detach().cpu().numpy() for k, v in policy.state_dict().items()
              if k.startswith(("mlp_extractor.value_net.", "value_net."))}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _load_critic(policy: Any, data: bytes | None) -> None:
    """Put a parent's critic (role ``"critic"``) into ``policy`` when its shapes match; else keep the fresh one."""
    import torch

    if not data:
        return
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception:  # noqa: BLE001 - a parent's critic is optional: unreadable bytes keep the fresh one
        return
    state = policy.state_dict()
    if set(arrays) != {k for k in state if k.startswith(("mlp_extractor.value_net.", "value_net."))} or \
            any(tuple(state[k].shape) != arrays[k].shape for k in arrays):
        return
    policy.load_state_dict({**state, **{k: torch.as_tensor(v, dtype=state[k].dtype) for k, v in arrays.items()}})


#: Attributes left out of saved zips: wall-clock times (so equal training gives equal bytes) and
#: per-episode buffers with times in them.
_SAVE_EXCLUDE = ["start_time", "ep_info_buffer", "ep_success_buffer", "_last_obs", "_last_original_obs",
                 "_last_episode_starts"]


def canonical_zip(data: bytes) -> bytes:
    """A zip's members rewritten with a fixed timestamp, so equal contents give equal bytes."""
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            zi = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            dst.writestr(zi, src.read(info.filename))
    return buf.getvalue()


def _build_model(task: Any, parent: Mapping[str, Any], s: Mapping[str, Any], seeds: Sequence[int], seed: int) -> tuple[Any, Any]:
    """The SB3 model to train and the parent's network (None for sb3 parents)."""
    import torch
    from stable_baselines3 import PPO

    from ratchet.errors import PolicyError
    from ratchet.policies import mlp, sb3

    kind, arts = parent["kind"], parent["artifacts"]
    if kind == "sb3":
        data = arts["model"]
        algo = sb3.algorithm_of(data)
        env = _seeded_reset(task.make_env(), seeds)
        if "vecnormalize" in arts:  # trained in a VecNormalize: train on in its frozen statistics
            from stable_baselines3.common.monitor import Monitor
            from stable_baselines3.common.vec_env import DummyVecEnv

            vn = sb3.load_vecnormalize(arts["vecnormalize"])
            vn.set_venv(DummyVecEnv([lambda: Monitor(env)]))
            env = vn
        if algo == "PPO":
            h = _hyper(s, fill=False)
            # settings that replace the model's own schedules also keep their pickles from being read
            objects: dict[str, Any] = {}
            if "learning_rate" in h:
                objects.update(learning_rate=h["learning_rate"], lr_schedule=lambda _: h["learning_rate"])
            if "clip_range" in h:
                objects["clip_range"] = h["clip_range"]
            model = sb3.load_model(data, env=env, custom_objects=objects, n_steps=int(s["n_steps"]), seed=seed,
                                   **h)
        else:  # A2C, SAC, TD3: their own algorithm and hyperparameters
            model = sb3.load_model(data, env=env, seed=seed)
        if s.get("log_std_init") is not None and getattr(model.policy, "log_std", None) is not None:
            with torch.no_grad():
                model.policy.log_std.fill_(float(s["log_std_init"]))
        return model, None
    if kind == "mlp":
        net = mlp.load_weights(arts["weights"])
        env = _normalized(_seeded_reset(task.make_env(), seeds), net)
    elif kind == "residual":
        net = mlp.load_weights(arts["correction"])
        env = _normalized(_residual_env(task.make_env(), seeds, parent["source"], parent["params"], net), net)
    else:
        raise PolicyError(f"the ppo trainer cannot train a {kind!r} policy")
    box = net.log_std.size > 0
    log_std = s.get("log_std_init")
    if log_std is None:
        log_std = float(net.log_std.mean()) if box else 0.0
    act = torch.nn.Tanh if net.activation == "tanh" else torch.nn.ReLU
    model = PPO("MlpPolicy", env, n_steps=int(s["n_steps"]), seed=seed, device="cpu", verbose=0,
                policy_kwargs={"net_arch": {"pi": net.hidden, "vf": list(s.get("critic_hidden") or [64, 64])},
                               "activation_fn": act, "log_std_init": log_std},
                **_hyper(s, fill=True))
    mlp.to_sb3_actor(net, model.policy, log_std=box and s.get("log_std_init") is None)
    _load_critic(model.policy, arts.get("critic"))
    return model, net


def train(task: Any, parent: Mapping[str, Any], settings: Mapping[str, Any], seeds: Sequence[int],
          env_steps: int) -> tuple[list[Any], int]:
    """The trainer of ``ppo`` and ``residual`` jobs (see :mod:`ratchet.execution.training`); runs in the sandbox.

    Args:
        task: The :class:`~ratchet.task.GymTask`.
        parent: ``{"kind", "source", "params", "artifacts": {role: bytes}}``.
        settings: The refiner's settings plus ``seed`` (the job's random seed).
        seeds: Training seeds; episodes reset through them in turn.
        env_steps: Env steps allowed, split evenly into ``settings["checkpoints"]`` parts.

    Returns:
        One :class:`~ratchet.execution.training.TrainingOutput` per checkpoint (new artifacts: ``weights``
        and ``critic`` for mlp, ``correction`` and ``critic`` for residual, ``model`` for sb3; info:
        ``env_steps`` so far, ``episodes`` finished in the part and their ``train_return_mean``), and the env
        steps used.
    """
    import torch

    from ratchet.policies import mlp
    from ratchet.policies.sb3 import _torch_single_thread

    _torch_single_thread()
    seed = int(settings["seed"])
    torch.manual_seed(seed)
    np.random.seed(seed)
    model, net = _build_model(task, parent, settings, seeds, seed)
    k = int(settings["checkpoints"])
    per = env_steps // k
    unit = int(getattr(model, "n_steps", 1) or 1) * int(getattr(model, "n_envs", 1) or 1)
    per = max(unit, per // unit * unit) if getattr(model, "n_steps", None) else per  # never past the allowance
    outputs, seen, before = [], 0, int(model.num_timesteps)  # a loaded zip counts its earlier training too
    monitor = model.get_env().envs[0]
    for i in range(k):
        model.learn(per, reset_num_timesteps=False, progress_bar=False)
        returns = list(monitor.get_episode_rewards())
        new, seen = returns[seen:], len(returns)
        info = {"checkpoint": i + 1, "env_steps": int(model.num_timesteps) - before, "episodes": len(new),
                "train_return_mean": float(np.mean(new)) if new else None}
        if net is None:
            buf = io.BytesIO()
            model.save(buf, exclude=_SAVE_EXCLUDE)
            arts = {"model": canonical_zip(buf.getvalue())}
        else:
            role = "weights" if parent["kind"] == "mlp" else "correction"
            arts = {role: mlp.from_sb3_actor(net, model.policy).to_bytes(), "critic": _critic_bytes(model.policy)}
        outputs.append(TrainingOutput(arts, info))
    return outputs, int(model.num_timesteps) - before


# -- what the trainer answers (checked in the driver before it is recorded or used) ----------------------
def _check_model_zip(data: bytes) -> None:
    """An SB3 model as a zip archive with SB3's members, its declared sizes within the caps (never unpickled)."""
    names = set(check_zip(data))
    if not {"data", "policy.pth"} <= names:
        raise ValueError("not a Stable-Baselines3 model archive (no 'data' and 'policy.pth')")


def _check_critic(data: bytes) -> None:
    """The critic's arrays: an .npz of numbers (read from its headers)."""
    if not all(h.dtype.kind == "f" for h in npz_headers(data)):
        raise ValueError("a critic whose arrays are not floats")


def answer(kind: str) -> TrainingAnswer:
    """What the ``ppo``/``residual`` trainer answers for a parent of policy kind ``kind``: one output per
    checkpoint (at most the job's ``checkpoints``), with ``weights`` and ``critic`` (mlp), ``correction`` and
    ``critic`` (residual) or ``model`` (sb3), and info ``checkpoint``, ``env_steps`` (so far, at most the job's
    allowance), ``episodes`` (finished in the part) and ``train_return_mean`` (null without one)."""
    if kind == "sb3":
        roles: tuple[Role, ...] = (Role("model", max_bytes=1 << 30, check=_check_model_zip),)
    else:
        roles = (Role("weights" if kind == "mlp" else "correction", check=load_weights),
                 Role("critic", check=_check_critic))
    return TrainingAnswer(
        roles=roles,
        info=(InfoField("checkpoint", "int", low=1, high=lambda job: int(job.settings["checkpoints"])),
              InfoField("env_steps", "int", low=0, high=lambda job: job.env_steps),
              InfoField("episodes", "int", low=0, high=lambda job: job.env_steps),
              InfoField("train_return_mean", "float", nullable=True)),
        max_outputs=lambda job: int(job.settings["checkpoints"]))


def _build(trainer: str) -> Any:
    def build(settings: PPOSettings, name: str, ctx: Any) -> list[PPORefiner]:
        return [PPORefiner(settings, name, ctx, trainer)]

    return build


def _kinds() -> dict[str, Any]:
    from ratchet.refiners.registry import RefinerKind

    return {"ppo": RefinerKind(PPOSettings, ("mlp", "sb3"), _build("ppo"),
                               hint="ppo trains network policies ([policy] kind = \"mlp\" or \"sb3\")"),
            "residual": RefinerKind(ResidualSettings, ("residual",), _build("residual"),
                                    hint="residual trains the correction of a [policy] kind = \"residual\" policy")}


KINDS = _kinds()
