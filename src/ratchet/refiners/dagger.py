"""Learning from corrections: ``dagger``, ``hg-dagger`` and ``bc`` refiners of an ``mlp`` student.

An *expert* (a program policy file named in the refiner's table) corrects a *student* (the run's ``mlp``
policy). Each round is one sandboxed training job (trainer ``"dagger"``) that

1. collects labelled steps on fresh training seeds:

   - ``dagger`` — DAgger (S. Ross, G. Gordon, J. A. Bagnell, "A Reduction of Imitation Learning and
     Structured Prediction to No-Regret Online Learning", AISTATS 2011): the student acts, the expert
     labels every state the student visits (β = 0 after the initial demonstrations);
   - ``hg-dagger`` — HG-DAgger (M. Kelly, C. Sidrane, K. Driggs-Campbell, M. J. Kochenderfer,
     "HG-DAgger: Interactive Imitation Learning with Human Experts", ICRA 2019): the student acts until a
     *takeover rule* fires, then the expert drives until it hands back; only the expert's (takeover)
     steps are labelled. The rule is ``takeover(observation, params) -> bool`` in the expert file, or,
     without one, disagreement (the student's action differs from the expert's: Discrete actions
     unequal, Box actions farther apart than ``disagreement``); the expert hands back once the rule has
     been false for ``handback_steps`` consecutive steps;
   - ``bc`` — behaviour cloning alone (the baseline): the expert drives whole episodes, all labelled;

2. aggregates them with the data set so far (role ``"dataset"``, :class:`ratchet.data.Dataset`, an
   artifact carried by every student candidate), and
3. retrains the student by behaviour cloning on the aggregate (NumPy, Adam, cross-entropy for a Discrete
   action space, squared error for a Box one; deterministic for a given seed).

When no data set exists yet (the run's starting network), round 0 is behaviour cloning on
``initial_episodes`` expert episodes, or on ``demonstrations`` (a data set file, e.g. converted from
Minari). Each round's student is one candidate and passes the same gate as
any other; the data set keeps growing even when the gate rejects a student (the next round rolls the
incumbent out again and aggregates onto the newest data). Per round, the job's ``info`` (recorded in the
``training_finished`` event) says for every episode which steps the expert controlled (segments
``[start, end, who]``, end exclusive) and which it labelled; :meth:`CorrectionRefiner.rounds` reads it
back, from the ledger on resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ratchet.critic import Critique
from ratchet.data import Dataset
from ratchet.errors import PolicyError
from ratchet.execution.training import InfoField, Role, TrainingAnswer, TrainingJob, TrainingOutput
from ratchet.policies.mlp import load_weights
from ratchet.policy import Candidate, PolicyProgram, parse_policy
from ratchet.refiners.base import GenerationCost, Refiner

__all__ = ["ANSWER", "MODES", "CorrectionRefiner", "CorrectionSettings", "behaviour_cloning", "collect", "train"]

#: Refiner kind -> how a round collects data.
MODES = ("dagger", "hg-dagger", "bc")


class CorrectionSettings(BaseModel):
    """Settings of a ``dagger``, ``hg-dagger`` or ``bc`` refiner (a ``[[refiners]]`` table)."""

    model_config = ConfigDict(extra="forbid")

    expert: str | None = Field(None, description="The expert: a program policy file (PARAMETERS + act, optionally "
                                                 "takeover), relative to the spec file. Optional with "
                                                 "demonstrations: round 0 clones them, and without an expert "
                                                 "no later round runs (the refiner goes idle).")
    expert_params: dict[str, Any] = Field(default_factory=dict, description="Values for the expert's PARAMETERS "
                                                                            "(the file's defaults otherwise).")
    initial_episodes: int = Field(5, ge=1, le=10_000, description="Expert episodes of round 0 (behaviour cloning "
                                                                   "before any correction), when the student has no "
                                                                   "data set.",
                                  json_schema_extra={"unit": "episodes"})
    demonstrations: str | None = Field(None, description="A data set to start from instead (round 0 clones it, no "
                                                         "expert episodes): a ratchet .npz, e.g. "
                                                         "ratchet.data.from_minari(...).to_bytes(), relative to "
                                                         "the spec.")
    episodes: int = Field(5, ge=1, le=10_000, description="Episodes per round (training seeds).",
                          json_schema_extra={"unit": "episodes"})
    rounds: int | None = Field(None, ge=1, le=100_000, description="Correction rounds after round 0; none: until "
                                                                   "the budget ends.",
                               json_schema_extra={"unit": "rounds"})
    label_budget: int | None = Field(None, ge=1, le=10**8, description="Most expert-labelled steps per round: "
                                                                       "collection stops there (equal labels "
                                                                       "for a fair comparison of kinds).",
                                     json_schema_extra={"unit": "labelled env steps"})
    handback_steps: int = Field(10, ge=1, le=100_000, description="hg-dagger: the expert hands back after the "
                                                                  "takeover rule was false this many steps in a row.",
                                json_schema_extra={"unit": "env steps"})
    disagreement: float = Field(0.1, gt=0, description="hg-dagger without a takeover function, Box actions: take "
                                                       "over when the student's action is farther than this "
                                                       "(Euclidean) from the expert's.")
    updates: int = Field(2000, ge=1, le=10**7, description="Gradient steps of behaviour cloning per round.",
                         json_schema_extra={"unit": "gradient steps"})
    batch_size: int = Field(256, ge=1, le=1 << 20, description="Labelled steps per minibatch of behaviour cloning "
                                                              "(all of them when the data set holds fewer).",
                            json_schema_extra={"unit": "labelled env steps"})
    learning_rate: float = Field(1e-3, gt=0, le=1, description="Adam step size of behaviour cloning.")
    normalize_from_data: bool = Field(True, description="Round 0 sets the network's observation normalisation "
                                                        "to the mean and standard deviation of the demonstrations.")

    @field_validator("expert")
    @classmethod
    def _expert(cls, v: str | None) -> str | None:
        if v is not None and not v.endswith(".py"):
            raise ValueError(f"expected a program policy file (.py), got {v!r}")
        return v

    @model_validator(mode="after")
    def _expert_or_demonstrations(self) -> CorrectionSettings:
        if self.expert is None and self.demonstrations is None:
            raise ValueError("give expert (a program policy file) or demonstrations (a data set file), or both")
        if self.expert is None and self.expert_params:
            raise ValueError("expert_params without an expert")
        return self


class CorrectionRefiner(Refiner):
    """One correction refiner (DAgger, HG-DAgger or BC): one round per :meth:`propose` (see the module doc).

    Args:
        mode: ``"dagger"``, ``"hg-dagger"`` or ``"bc"``.
        settings: The table's settings.
        expert: The expert program (parsed, never executed here) and its source; None without an expert
            (``demonstrations`` only: round 0 clones them, then the refiner is idle).
        expert_digest: The artifact digest of the expert file's bytes (the training jobs carry it), or None.
        context: The loop's :class:`~ratchet.refiners.registry.RefinerContext`.
    """

    def __init__(self, mode: str, settings: CorrectionSettings, expert: PolicyProgram | None,
                 expert_digest: str | None, context: Any) -> None:
        self.mode, self.settings, self.expert, self.ctx = mode, settings, expert, context
        self.name = context.name
        self.expert_digest = expert_digest
        unknown = sorted(set(settings.expert_params) - {p.name for p in expert.parameters}) if expert else []
        if unknown:
            raise PolicyError(f"[[refiners]] {self.name}: expert_params {unknown} are not PARAMETERS of "
                              f"{settings.expert}")
        declared = {p.name: p for p in expert.parameters} if expert else {}
        try:  # each value in its parameter's form: a float, an int, a choice (PolicyProgram.candidate's rule)
            given = {k: declared[k].coerce(v) for k, v in settings.expert_params.items()}
        except PolicyError as exc:
            raise PolicyError(f"[[refiners]] {self.name}: expert_params: {exc}") from None
        self.expert_params = {**(expert.defaults if expert else {}), **given}
        self._dataset: str | None = None  # digest of the newest aggregated data set
        self._rounds: list[dict[str, Any]] = []
        self._errors: list[str] = []
        self._failures = 0  # training jobs failed in a row
        self.demonstrations: str | None = None  # digest of a data set to start from (settings.demonstrations)
        self._no_expert = False  # a round after round 0 was asked for without an expert

    # -- what the loop asks --------------------------------------------------------------------
    @property
    def training_env_steps(self) -> int:
        """Env steps the next round's training job is allowed (its episodes × the task's time limit)."""
        if self._dataset is None and self.demonstrations is not None:
            return 0
        n = self.settings.initial_episodes if self._dataset is None else self.settings.episodes
        return n * int(self.ctx.task.step_limit or 1000)

    def generation_cost(self) -> GenerationCost:
        """One round: its new student (beside the incumbent) and its training job's env steps."""
        return GenerationCost(proposals=1, training_env_steps=self.training_env_steps)

    def idle_reason(self) -> str | None:
        """Why no further round runs (None when one can)."""
        if self.settings.rounds is not None and self._rounds and self._rounds[-1]["round"] >= self.settings.rounds:
            return f"{self.name}: {self.settings.rounds} correction rounds done"
        if self.expert is None and (self._rounds or self._no_expert):
            return (f"{self.name}: no expert: round 0 cloned the demonstrations; later rounds need an expert "
                    "(set expert in the refiner's table)")
        if self._failures >= 3:
            return f"{self.name}: training failed {self._failures} times in a row: {self._errors[-1]}"
        return None

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """Run one round (a training job) from ``parent`` (the incumbent student) and propose its new student.

        Returns an empty list when the parent is not an ``mlp`` policy or the job failed (the failure is
        in the ledger's ``training_finished`` event).
        """
        if parent.kind != "mlp" or "weights" not in parent.artifacts:
            return []
        data = self._dataset or parent.artifacts.get("dataset")
        first = data is None
        round_no = 0 if first else (int(self._rounds[-1]["round"]) + 1 if self._rounds else 1)
        n = self.settings.initial_episodes if first else self.settings.episodes
        if first and self.demonstrations is not None:  # round 0 clones the given demonstrations instead
            data, n = self.demonstrations, 0
        elif self.expert is None:  # nobody to label a later round
            self._no_expert = True
            return []
        arts = {"weights": parent.artifacts["weights"]}
        if self.expert_digest is not None:
            arts["expert"] = self.expert_digest
        if data is not None:
            arts["dataset"] = data
        job_parent = Candidate.create("", {}, kind="mlp", artifacts=arts, parent_id=parent.id, refiner=self.name)
        settings = {**self.settings.model_dump(mode="json"), "mode": "bc" if first else self.mode, "round": round_no,
                    "expert_params": _jsonable(self.expert_params), "seed": int(self.ctx.seed) + round_no,
                    "env_id": self.ctx.task.env_id}
        seeds = self.ctx.training_seeds(n)
        limit = int(self.ctx.task.step_limit or 1000)
        result = self.ctx.train(TrainingJob("dagger", job_parent, settings, tuple(seeds), n * limit, answer=ANSWER))
        if result.error or not result.outputs:
            self._errors.append(result.error or "no output")
            self._failures += 1
            return []
        self._failures = 0
        out = result.outputs[0]
        digests = out.info["artifacts"]
        self._dataset = digests["dataset"]
        info = {k: v for k, v in out.info.items() if k != "artifacts"}
        self._rounds.append(info)
        return [Candidate.create("", {}, kind="mlp", artifacts={"weights": digests["weights"],
                                                                 "dataset": digests["dataset"]},
                                 parent_id=parent.id, refiner=self.name)]

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """One dict per round run so far (the training job's info): ``round``, ``mode``, ``episodes`` (per
        episode: ``seed``, ``length``, ``return``, ``segments`` ``[[start, end, who], …]``, ``labelled``
        ``[[start, end], …]``, ``expert_steps``), ``labelled_steps``, ``expert_steps``, ``dataset`` (summary)
        and ``bc`` (loss and accuracy)."""
        return list(self._rounds)


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    def thaw(v: Any) -> Any:  # an int or a choice as itself
        return [thaw(x) for x in v] if isinstance(v, (tuple, list)) else v if isinstance(v, (int, str)) else float(v)

    return {k: thaw(v) for k, v in params.items()}


# -- the trainer (runs in the sandbox) ----------------------------------------------------------------
class _Expert:
    """The expert program, executed (only inside the sandbox)."""

    def __init__(self, source: str, params: Mapping[str, Any], observation_space: Any, action_space: Any) -> None:
        from ratchet.policy import bind_spaces, compile_policy, materialize

        self.module = compile_policy(source, "<expert>")
        bind_spaces(self.module, observation_space, action_space)
        self.params = materialize(params)
        self.has_takeover = callable(getattr(self.module, "takeover", None))

    def reset(self, seed: int) -> None:
        if hasattr(self.module, "reset"):
            self.module.reset(self.params, seed)

    def act(self, obs: Any) -> Any:
        return self.module.act(obs, self.params)

    def takeover(self, obs: Any) -> bool:
        return bool(self.module.takeover(obs, self.params))


def _runs(mask: Sequence[bool]) -> list[list[int]]:
    """``[[start, end], …]`` (end exclusive) of the True runs of ``mask``."""
    out: list[list[int]] = []
    for i, m in enumerate(mask):
        if m and (not out or out[-1][1] != i):
            out.append([i, i + 1])
        elif m:
            out[-1][1] = i + 1
    return out


def collect(task: Any, mode: str, student: Any, expert: Any, seeds: Sequence[int], *, round_no: int,
            first_episode: int = 0, label_budget: int | None = None, handback_steps: int = 10,
            disagreement: float = 0.1) -> tuple[Any, list[dict[str, Any]], int]:
    """Roll out on ``seeds`` and label steps with the expert (one round's data; see the module doc).

    Args:
        task: The task (its env is made here).
        mode: ``"dagger"``, ``"hg-dagger"`` or ``"bc"``.
        student: Has ``act(observation)`` (an :class:`~ratchet.policies.mlp.MLP`); unused for ``"bc"``.
        expert: Has ``reset(seed)``, ``act(observation)``, ``has_takeover`` and ``takeover(observation)``.
        seeds: Episode reset seeds, in order.
        round_no: Recorded in the data set's ``round`` column.
        first_episode: Episode index of the first episode (continues the aggregate's numbering).
        label_budget: Stop once this many steps are labelled (the episode under way stops there too).
        handback_steps: hg-dagger: consecutive steps with the rule false before the expert hands back.
        disagreement: hg-dagger without a takeover function, Box actions: distance that counts as disagreement.

    Returns:
        ``(data, episodes, env_steps)``: the labelled steps (:class:`~ratchet.data.Dataset`), one record per
        episode (``seed``, ``length``, ``return``, ``terminated``, ``truncated``, ``segments``, ``labelled``,
        ``expert_steps``) and the env steps taken.
    """
    from ratchet.data import Dataset
    from ratchet.rollout import action_checker

    env = task.make_env()
    try:
        space = env.action_space
        discrete = hasattr(space, "n")
        check = action_checker(space, "clip" if mode == "bc" else task.action_mode)
        obs_dim = int(np.prod(env.observation_space.shape))
        act_dim = 0 if discrete else int(np.prod(space.shape))

        def differ(a: Any, b: Any) -> bool:
            if discrete:
                return int(a) != int(b)
            return float(np.linalg.norm(np.asarray(a, float).ravel() - np.asarray(b, float).ravel())) > disagreement

        steps: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        env_steps = labelled = 0
        for k, seed in enumerate(seeds):
            if label_budget is not None and labelled >= label_budget:
                break
            obs, _ = env.reset(seed=int(seed))
            expert.reset(int(seed))
            control = "expert" if mode == "bc" else "student"
            calm = 0
            who: list[str] = []
            lab: list[bool] = []
            ret, t, terminated, truncated = 0.0, 0, False, False
            while True:
                a_exp = check(expert.act(obs))
                a_stu = None if mode == "bc" else check(student.act(obs))
                if mode == "hg-dagger":
                    danger = expert.takeover(obs) if expert.has_takeover else differ(a_stu, a_exp)
                    if control == "student" and danger:
                        control, calm = "expert", 0
                    elif control == "expert":
                        calm = 0 if danger else calm + 1
                        if calm >= handback_steps:
                            control = "student"
                label = mode in ("dagger", "bc") or control == "expert"
                action = a_exp if control == "expert" else a_stu
                nxt, reward, terminated, truncated, _ = env.step(action)
                env_steps += 1
                who.append(control)
                lab.append(label)
                ret += float(reward)
                if label:
                    steps.append({"obs": np.asarray(obs, float).ravel(), "next_obs": np.asarray(nxt, float).ravel(),
                                  "label": a_exp if discrete else np.asarray(a_exp, float).ravel(),
                                  "executed": action if discrete else np.asarray(action, float).ravel(),
                                  "reward": float(reward), "terminated": bool(terminated),
                                  "truncated": bool(truncated), "expert": control == "expert",
                                  "round": round_no, "episode": first_episode + k, "seed": int(seed), "step": t})
                    labelled += 1
                obs, t = nxt, t + 1
                if terminated or truncated or (label_budget is not None and labelled >= label_budget):
                    break
            segs: list[list[Any]] = []
            for i, w in enumerate(who):
                if segs and segs[-1][2] == w:
                    segs[-1][1] = i + 1
                else:
                    segs.append([i, i + 1, w])
            records.append({"seed": int(seed), "length": t, "return": ret, "terminated": bool(terminated),
                            "truncated": bool(truncated), "segments": segs, "labelled": _runs(lab),
                            "expert_steps": sum(w == "expert" for w in who)})
        data = Dataset.from_steps(steps, "discrete" if discrete else "box", obs_dim, act_dim, env_id=task.env_id)
        return data, records, env_steps
    finally:
        env.close()


def behaviour_cloning(mlp: Any, data: Any, *, updates: int = 2000, batch_size: int = 256,
                      learning_rate: float = 1e-3, seed: int = 0,
                      normalize: bool = False) -> tuple[Any, dict[str, Any]]:
    """Fit ``mlp`` to the expert's labels in ``data`` (behaviour cloning), starting from its weights.

    Adam (D. P. Kingma, J. Ba, 2015) on minibatches drawn with ``numpy.random.default_rng(seed)``; the loss is
    the cross-entropy of the labels under the softmax of the outputs (Discrete) or the squared error to the
    labels (Box). NumPy only, float64: the same inputs give the same weights.

    Args:
        mlp: The student (:class:`~ratchet.policies.mlp.MLP`).
        data: The labelled steps (:class:`~ratchet.data.Dataset`).
        updates: Gradient steps.
        batch_size: Steps per minibatch (all of them when fewer).
        learning_rate: Adam's step size.
        seed: Seeds minibatch sampling.
        normalize: Set the observation normalisation to the data's mean and standard deviation first.

    Returns:
        ``(new_mlp, info)``; info: ``loss_first``, ``loss_last`` (mean loss of the first and last 50
        updates), ``accuracy`` (Discrete: share of labels the new student reproduces) or ``mse`` (Box),
        ``updates``, ``steps``.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn brings it
        from contextlib import nullcontext as threadpool_limits

    # small matrices: extra BLAS threads only spin (40x slower on a busy 2-core machine, measured)
    with threadpool_limits(1):
        return _behaviour_cloning(mlp, data, updates=updates, batch_size=batch_size, learning_rate=learning_rate,
                                  seed=seed, normalize=normalize)


def _behaviour_cloning(mlp: Any, data: Any, *, updates: int, batch_size: int, learning_rate: float, seed: int,
                       normalize: bool) -> tuple[Any, dict[str, Any]]:
    from ratchet.policies.mlp import MLP

    x_raw = np.asarray(data.obs, dtype=np.float64)
    n = x_raw.shape[0]
    if n == 0:
        return mlp, {"updates": 0, "steps": 0}
    shift, scale = mlp.obs_shift, mlp.obs_scale
    if normalize:
        shift = x_raw.mean(axis=0)
        scale = 1.0 / np.maximum(x_raw.std(axis=0), 1e-3)
    x_all = (x_raw - shift) * scale
    discrete = mlp.action == "discrete"
    y_all = np.asarray(data.label)
    if not discrete:
        y_all = np.clip(y_all.reshape(n, -1).astype(np.float64), mlp.low, mlp.high)
    params = [a.copy() for wb in mlp.weights for a in wb]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2, eps = 0.9, 0.999, 1e-8
    rng = np.random.default_rng(seed)
    relu = mlp.activation == "relu"
    losses = []

    def forward(x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        hs = [x]
        h = x
        for i in range(0, len(params) - 2, 2):
            z = h @ params[i] + params[i + 1]
            h = np.maximum(z, 0.0) if relu else np.tanh(z)
            hs.append(h)
        return hs, h @ params[-2] + params[-1]

    bs = min(batch_size, n)
    for step in range(1, updates + 1):
        idx = rng.integers(0, n, bs)
        x, y = x_all[idx], y_all[idx]
        hs, out = forward(x)
        if discrete:
            z = out - out.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            loss = float(-np.log(p[np.arange(bs), y] + 1e-12).mean())
            g = p
            g[np.arange(bs), y] -= 1.0
            g /= bs
        else:
            d = out - y
            loss = float((d ** 2).sum(axis=1).mean())
            g = 2.0 * d / bs
        losses.append(loss)
        grads: list[Any] = [None] * len(params)
        for li in range(len(params) // 2 - 1, -1, -1):
            grads[2 * li] = hs[li].T @ g
            grads[2 * li + 1] = g.sum(axis=0)
            if li > 0:
                g = g @ params[2 * li].T
                g = g * (hs[li] > 0) if relu else g * (1.0 - hs[li] ** 2)
        for i, (p_, gr) in enumerate(zip(params, grads)):
            m[i] = b1 * m[i] + (1 - b1) * gr
            v[i] = b2 * v[i] + (1 - b2) * gr * gr
            p_ -= learning_rate * (m[i] / (1 - b1 ** step)) / (np.sqrt(v[i] / (1 - b2 ** step)) + eps)
    weights = [(params[i], params[i + 1]) for i in range(0, len(params), 2)]
    new = MLP(tuple(weights), np.asarray(shift, float), np.asarray(scale, float), mlp.log_std, mlp.activation,
              mlp.action, mlp.low, mlp.high)
    _, out = forward(x_all)
    info: dict[str, Any] = {"updates": updates, "steps": n, "loss_first": float(np.mean(losses[:50])),
                            "loss_last": float(np.mean(losses[-50:]))}
    if discrete:
        info["accuracy"] = float((out.argmax(axis=1) == y_all).mean())
    else:
        info["mse"] = float(((np.clip(out, mlp.low, mlp.high) - y_all) ** 2).sum(axis=1).mean())
    return new, info


def train(task: Any, parent: Mapping[str, Any], settings: Mapping[str, Any], seeds: Sequence[int],
          env_steps: int) -> tuple[list[Any], int]:
    """Trainer ``"dagger"`` (see :mod:`ratchet.execution.training`): one round — collect, aggregate, retrain.

    ``parent["artifacts"]``: ``weights`` (the student), ``expert`` (the expert's source), optionally ``dataset``
    (the aggregate so far). ``settings``: the refiner's table plus ``mode``, ``round``, ``expert_params``,
    ``seed``. Returns one output with artifacts ``weights`` and ``dataset`` and the round's record as info.

    Mode ``"person"`` (a person's correction round, :mod:`ratchet.correction_round`) collects nothing and needs
    no expert: artifact ``corrections`` holds the person's steps (:class:`~ratchet.data.Dataset`), which are
    aggregated as the round after the aggregate's newest and cloned from the student's weights (its observation
    normalisation kept); ``seeds`` and ``env_steps`` are empty and 0.
    """

    arts = parent["artifacts"]
    student = load_weights(arts["weights"])
    old = Dataset.from_bytes(arts["dataset"]) if "dataset" in arts else None
    mode, round_no = settings["mode"], int(settings["round"])
    if mode == "person":  # the person's steps were collected in the browser: nothing to roll out here
        new = Dataset.from_bytes(arts["corrections"])
        later = int(old.round.max()) + 1 if old is not None and len(old) else round_no  # after the aggregate's rounds
        new = dataclasses.replace(new, round=np.full(len(new), later, dtype=new.round.dtype))
        records: list[dict[str, Any]] = []
        used = 0
    elif "expert" not in arts:  # round 0 from demonstrations without an expert: nothing to collect
        if old is None or seeds:
            raise RuntimeError("no expert to collect episodes with")
        new, records, used = old.take(slice(0, 0)), [], 0
    else:
        env = task.make_env()
        try:
            spaces = (env.observation_space, env.action_space)
        finally:
            env.close()
        expert = _Expert(arts["expert"].decode("utf-8"), settings.get("expert_params", {}), *spaces)
        first_episode = int(old.episode.max()) + 1 if old is not None and len(old) else 0
        new, records, used = collect(task, mode, student, expert, seeds, round_no=round_no,
                                     first_episode=first_episode, label_budget=settings.get("label_budget"),
                                     handback_steps=int(settings.get("handback_steps", 10)),
                                     disagreement=float(settings.get("disagreement", 0.1)))
    if used > env_steps:
        raise RuntimeError(f"collection took {used} env steps, over the job's {env_steps}")
    data = new if old is None else old.concat(new)
    normalize = mode != "person" and round_no == 0 and bool(settings.get("normalize_from_data", True))
    student2, bc = behaviour_cloning(student, data, updates=int(settings.get("updates", 2000)),
                                     batch_size=int(settings.get("batch_size", 256)),
                                     learning_rate=float(settings.get("learning_rate", 1e-3)),
                                     seed=int(settings.get("seed", 0)), normalize=normalize)
    info = {"round": round_no, "mode": mode, "episodes": records, "labelled_steps": len(new),
            "expert_steps": int(new.expert.sum()), "env_steps": used,
            "expert_steps_per_episode": float(np.mean([r["expert_steps"] for r in records])) if records else 0.0,
            "dataset": data.summary(), "bc": bc}
    return [TrainingOutput({"weights": student2.to_bytes(), "dataset": data.to_bytes()}, info)], used


# -- what the trainer answers (checked in the driver before it is recorded or used) ----------------------
def _int(value: Any, low: int = 0, high: int = 10**12) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{value!r:.40} is not an int in {low}..{high}")
    return value


def _check_records(records: list[Any]) -> None:
    """The per-episode records of a round (see :func:`collect`)."""
    for r in records:
        if not isinstance(r, dict) or set(r) != _RECORD_KEYS:
            raise ValueError(f"an episode record with keys {sorted(map(str, r)) if isinstance(r, dict) else r!r:.80} "
                             f"(expected {sorted(_RECORD_KEYS)})")
        _int(r["seed"], -2**63, 2**64)
        length = _int(r["length"], 0, 10**9)
        _int(r["expert_steps"], 0, length)
        if isinstance(r["return"], bool) or not isinstance(r["return"], (int, float)) or not np.isfinite(r["return"]):
            raise ValueError("an episode record whose return is not a finite number")
        if not isinstance(r["terminated"], bool) or not isinstance(r["truncated"], bool):
            raise TypeError("an episode record whose terminated/truncated are not bools")
        for seg in r["segments"]:
            if not isinstance(seg, list) or len(seg) != 3 or seg[2] not in ("student", "expert"):
                raise ValueError("a segment that is not [start, end, 'student'|'expert']")
            _int(seg[0], 0, length), _int(seg[1], 0, length)
        for run in r["labelled"]:
            if not isinstance(run, list) or len(run) != 2:
                raise ValueError("a labelled run that is not [start, end]")
            _int(run[0], 0, length), _int(run[1], 0, length)


def _check_summary(summary: dict[str, Any]) -> None:
    """A data set's :meth:`~ratchet.data.Dataset.summary`."""
    if set(summary) != {"steps", "expert_steps", "episodes", "segments", "rounds"}:
        raise ValueError(f"a data set summary with keys {sorted(map(str, summary))}")
    for k in ("steps", "expert_steps", "episodes", "segments"):
        _int(summary[k])
    if not isinstance(summary["rounds"], list):
        raise TypeError("a data set summary whose rounds are not a list")
    for r in summary["rounds"]:
        _int(r, 0, 10**7)


def _check_numbers(values: dict[str, Any]) -> None:
    """Behaviour cloning's record: named finite numbers."""
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ValueError(f"{k!r:.40} is not a finite number")


_RECORD_KEYS = frozenset({"seed", "length", "return", "terminated", "truncated", "segments", "labelled",
                          "expert_steps"})


def _labelled_limit(job: Any) -> float:
    return job.env_steps if job.env_steps else 10**9  # a person's round (no env steps): the corrections' size


#: What trainer ``"dagger"`` answers: one output, the new student (``weights``, an mlp .npz) and the aggregate
#: (``dataset``, a :class:`~ratchet.data.Dataset` .npz), both read in the driver with the size caps of
#: :mod:`ratchet.npz`; info as :func:`train` writes it.
ANSWER = TrainingAnswer(
    roles=(Role("weights", check=load_weights), Role("dataset", max_bytes=1 << 30, check=Dataset.from_bytes)),
    info=(InfoField("round", "int", low=0, high=10**7),
          InfoField("mode", "str", choices=MODES + ("person",)),
          InfoField("episodes", "list", high=lambda job: len(job.seeds), check=_check_records),
          InfoField("labelled_steps", "int", low=0, high=_labelled_limit),
          InfoField("expert_steps", "int", low=0, high=_labelled_limit),
          InfoField("env_steps", "int", low=0, high=lambda job: job.env_steps),
          InfoField("expert_steps_per_episode", "float", low=0, high=10**9),
          InfoField("dataset", "dict", check=_check_summary),
          InfoField("bc", "dict", high=16, check=_check_numbers)))


# -- registration -------------------------------------------------------------------------------------
def _build(mode: str) -> Any:
    def build(settings: CorrectionSettings, name: str, ctx: Any) -> list[CorrectionRefiner]:
        from ratchet.ledger.artifacts import digest

        read = getattr(ctx, "read_input", None)
        if read is None:
            raise PolicyError(f"refiner {name}: this loop cannot read the files {_files(settings)}")
        expert = expert_digest = None
        if settings.expert is not None:
            data = read(settings.expert)
            try:
                source = data.decode("utf-8")
            except UnicodeDecodeError:
                raise PolicyError(f"[[refiners]] {name}: expert {settings.expert} is not UTF-8 text") from None
            expert, expert_digest = parse_policy(source, settings.expert), digest(data)
        refiner = CorrectionRefiner(mode, settings, expert, expert_digest, ctx)
        if settings.demonstrations is not None:
            from ratchet.data import DataError, Dataset

            demos = read(settings.demonstrations)
            observation_space, action_space = ctx.task.spaces()
            try:
                # NumPy arrays only (allow_pickle=False): safe to open here
                Dataset.from_bytes(demos).check_spaces(observation_space, action_space, ctx.task.name)
            except DataError as exc:
                raise PolicyError(f"[[refiners]] {name}: demonstrations {settings.demonstrations}: {exc}") from None
            refiner.demonstrations = digest(demos)
        return [refiner]

    return build


def _files(settings: CorrectionSettings) -> list[str]:
    return [f for f in (settings.expert, settings.demonstrations) if f]


def _kinds() -> dict[str, Any]:
    from ratchet.refiners.registry import RefinerKind

    hint = "dagger, hg-dagger and bc train an mlp student: set [policy] kind = \"mlp\""
    return {m: RefinerKind(CorrectionSettings, ("mlp",), _build(m), hint=hint, files=_files) for m in MODES}


KINDS = _kinds()
