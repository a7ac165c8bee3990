"""Run spec: a TOML file (``ratchet.toml``) validated into typed settings.

Example::

    name = "cartpole"
    seed = 0

    [task]
    env_id = "CartPole-v1"

    [policy]
    path = "policy.py"

    [budget]
    env_steps = 50_000
    target = 500

Unknown keys are rejected; every error names the key and the fix.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ratchet.errors import SpecError, TaskError
from ratchet.execution.sandbox import Sandbox
from ratchet.refiners.cmaes import CMAESSettings
from ratchet.rollout import LOCKSTEP_EPISODES
from ratchet.worldmodel.screen import HORIZON_CAP, MIN_CORRELATION, WINDOW

__all__ = ["RunSpec", "load_spec", "spec_from_dict"]

#: Most episodes of one split per candidate (training, validation, test) and per Ray batch.
MAX_EPISODES = 100_000
#: Longest per-episode wall-clock limit, seconds (one day).
MAX_TIMEOUT_S = 86_400.0
#: Longest time limit of one episode, env steps.
MAX_EPISODE_STEPS = 100_000_000
#: Most worker processes (or local Ray CPUs).
MAX_WORKERS = 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class TaskSpec(_Section):
    """``[task]``: what an episode is and what counts as success.

    ``kind = "gym"`` (default): a registered Gymnasium environment, ``env_id``. ``kind = "evaluator"``: a user's
    evaluator module, ``evaluator`` (a ``.py`` file relative to the spec's folder; see
    :mod:`ratchet.tasks.evaluator`), scoring the policy's functions on problem instances.
    """

    kind: Literal["gym", "evaluator", "game", "openevolve"] = Field(
        "gym", description="\"gym\": a Gymnasium environment (env_id); \"evaluator\": a module that scores a policy "
                           "on problem instances (evaluator); \"game\": a PettingZoo or OpenSpiel game against a pool "
                           "of opponents (game, opponents).")
    game: str | None = Field(None, min_length=1, description="kind = \"game\": a PettingZoo AEC id "
                             "(\"classic/connect_four-v3\") or \"openspiel:NAME\" (\"openspiel:kuhn_poker\").")
    opponents: dict[str, Any] = Field(default_factory=dict, description="kind = \"game\": the opponent pool, name "
                                      "-> policy file (relative to the spec's folder) or {path, params}.")
    train_opponents: list[str] | None = Field(None, min_length=1, description="kind = \"game\": the opponents "
                                              "training episodes meet; default all.")
    validation_opponents: list[str] | None = Field(None, min_length=1, description="kind = \"game\": the opponents "
                                                   "the gate's validation episodes meet; default all.")
    test_opponents: list[str] | None = Field(None, min_length=1, description="kind = \"game\": the opponents test "
                                             "episodes meet; default all.")
    seats: list[int] | None = Field(None, min_length=1, description="kind = \"game\": the seats the candidate "
                                    "plays (0-based); each episode's seed picks one; default every seat.")
    illegal: Literal["fail", "replace"] = Field("fail", description="kind = \"game\": an illegal move loses the "
                                                "episode as the candidate's failure, or is replaced by a random "
                                                "legal move and counted.")
    max_moves: int | None = Field(None, gt=0, le=MAX_EPISODE_STEPS, description="kind = \"game\": most moves "
                                  "(both sides, env steps) per episode; default the game's bound or 1000.",
                                  json_schema_extra={"unit": "moves (env steps)"})
    game_kwargs: dict[str, Any] = Field(default_factory=dict, description="kind = \"game\": arguments for "
                                        "pettingzoo.make or pyspiel.load_game.")
    objective: Literal["payoff", "exploitability"] = Field(
        "payoff", description="kind = \"game\": \"payoff\": an episode is a game against an opponent; "
                              "\"exploitability\" (OpenSpiel games small enough, e.g. Kuhn and Leduc poker): an "
                              "episode is the exact exploitability of the policy's probabilities(), its return minus "
                              "that, so the gate promotes only what lowers it.")
    league: bool = Field(False, description="kind = \"game\": self-play league: the start policy and each incumbent a "
                                            "promotion puts in place join the training opponents, drawn from the "
                                            "meta-strategy (the Nash equilibrium of the league's payoff table).")
    league_games: int | None = Field(None, ge=0, json_schema_extra={"unit": "episodes"},
                                     description="kind = \"game\" with league: games a candidate the gate would "
                                                 "promote plays against each league member (every incumbent so "
                                                 "far), seats in turn; it is refused if it loses to any on average. "
                                                 "Default 2 per seat; 0: no check.")
    env_id: str | None = Field(None, description="kind = \"gym\": registered Gymnasium id, e.g. \"LunarLander-v3\".")
    evaluator: str | None = Field(None, min_length=1, description="kind = \"evaluator\": the evaluator module "
                                                                   "(.py, relative to the spec's folder).")
    name: str | None = Field(None, min_length=1, max_length=80, description="kind = \"evaluator\": what people and "
                                                                           "prompts call the task; default the "
                                                                           "evaluator file's name.")
    program: str | None = Field(None, min_length=1, description="kind = \"openevolve\": the program file the "
                                "evaluator is given, in the policy's folder (default \"initial_program.py\").")
    metric: str | None = Field(None, min_length=1, max_length=40, description="kind = \"openevolve\": the metric "
                               "of evaluate()'s dict that is the score (default \"combined_score\").")
    options: dict[str, Any] = Field(default_factory=dict, description="kind = \"evaluator\": settings for the "
                                    "evaluator, its module global OPTIONS (e.g. which instances to make).")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for gymnasium.make.")
    success_threshold: float | None = Field(None, description="Return (an evaluator's score) at or above which an "
                                            "episode succeeds; default: the env's reward_threshold.",
                                            json_schema_extra={"unit": "return units"})
    deterministic: bool = Field(False, description="The score is deterministic: a candidate scores the same on "
                                "every seed and every time (one fixed problem, as circle packing). Each distinct "
                                "candidate is then scored once, and the gate promotes a strict improvement beyond "
                                "[gate] tolerance, confirmed by one exact re-evaluation: no statistics ([planner] "
                                "decide = \"exact\", [gate] test = \"exact\", train_episodes and [test] episodes 1 "
                                "by default). Evaluator and gym tasks.")
    action: Literal["error", "clip"] = Field("error", description="Invalid actions: make the episode an error, or clip.")
    max_episode_steps: int | None = Field(None, gt=0, le=MAX_EPISODE_STEPS,
                                          description="Override the env's time limit (env steps per episode); "
                                                      "required for an env registered without one.",
                                          json_schema_extra={"unit": "env steps"})
    description: str | None = Field(None, min_length=1, max_length=4000,
                                    description="The task's rewards and episode end in words, for the llm "
                                                "refiner's prompts; default: the Rewards and Episode End sections "
                                                "of the env's documentation.")

    @field_validator("env_kwargs")
    @classmethod
    def _no_time_limit_kwarg(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "max_episode_steps" in v:  # one place for the time limit, the one the budget's worst case reads
            raise ValueError(f"max_episode_steps = {v['max_episode_steps']!r} is the time limit, not an env "
                             "argument; move it to [task] max_episode_steps")
        return v

    @field_validator("env_id")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        from ratchet.tasks.gym import gym_spec

        if v is not None:
            try:
                gym_spec(v)
            except TaskError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> TaskSpec:
        if self.kind != "openevolve" and (self.program is not None or self.metric is not None):
            raise ValueError("program and metric belong to OpenEvolve tasks; add kind = \"openevolve\" or remove them")
        game_keys = [k for k in ("game", "train_opponents", "validation_opponents", "test_opponents", "seats",
                                 "max_moves") if getattr(self, k) is not None]
        game_keys += [k for k in ("opponents", "game_kwargs") if getattr(self, k)]
        game_keys += ["illegal"] if self.illegal != "fail" else []
        game_keys += ["league"] if self.league else []
        game_keys += ["league_games"] if self.league_games is not None else []
        game_keys += ["objective"] if self.objective != "payoff" else []
        if self.kind == "game":
            wrong = [k for k in ("env_id", "evaluator", "max_episode_steps", "description") if getattr(self, k) is not None]
            wrong += ["deterministic"] if self.deterministic else []
            wrong += [k for k in ("env_kwargs", "options") if getattr(self, k)]
            wrong += ["action"] if self.action != "error" else []
            if wrong:
                raise ValueError(f"{', '.join(wrong)} do(es) not apply to game tasks; a game task takes game, "
                                 "opponents, train/validation/test_opponents, seats, illegal, max_moves, game_kwargs, "
                                 "name and success_threshold")
            from ratchet.tasks import task_from_spec

            try:
                task_from_spec(self)
            except TaskError as exc:
                raise ValueError(str(exc)) from None
            return self
        if game_keys:
            raise ValueError(f"{game_keys[0]} belongs to game tasks; add kind = \"game\" or remove it")
        if self.kind == "openevolve":
            if self.evaluator is None:
                raise ValueError("kind = \"openevolve\" needs evaluator = \"evaluator.py\" (OpenEvolve's evaluator, "
                                 "evaluate(program_path) -> dict of metrics)")
            wrong = [k for k in ("env_id", "max_episode_steps", "description") if getattr(self, k) is not None]
            wrong += [k for k in ("env_kwargs", "options") if getattr(self, k)]
            wrong += ["action"] if self.action != "error" else []
            if wrong:
                raise ValueError(f"{', '.join(wrong)} do(es) not apply to OpenEvolve tasks; an OpenEvolve task takes "
                                 "evaluator, program, metric, name and success_threshold")
            from ratchet.tasks import task_from_spec

            try:
                task_from_spec(self)
            except TaskError as exc:
                raise ValueError(str(exc)) from None
            return self
        if self.kind == "evaluator":
            if self.evaluator is None:
                raise ValueError("kind = \"evaluator\" needs evaluator = \"evaluate.py\" (the module that scores a "
                                 "policy on problem instances)")
            wrong = [k for k in ("env_id", "max_episode_steps", "description") if getattr(self, k) is not None]
            wrong += ["env_kwargs"] if self.env_kwargs else []
            wrong += ["action"] if self.action != "error" else []
            if wrong:
                raise ValueError(f"{', '.join(wrong)} belong(s) to Gymnasium tasks; an evaluator task takes "
                                 "evaluator, name, options and success_threshold (its DESCRIPTION, COST_UNIT and "
                                 "MAX_COST are the module's)")
            from ratchet.tasks import task_from_spec

            try:
                task_from_spec(self)
            except TaskError as exc:
                raise ValueError(str(exc)) from None
            return self
        if self.env_id is None:
            raise ValueError("missing [task] env_id; set it to a Gymnasium id such as \"CartPole-v1\" (or kind = "
                             "\"evaluator\" with evaluator = \"evaluate.py\")")
        if self.options:
            raise ValueError("options belong to evaluator tasks (a Gymnasium env takes env_kwargs)")
        for k in ("evaluator", "name"):
            if getattr(self, k) is not None:
                raise ValueError(f"{k} belongs to evaluator tasks; add kind = \"evaluator\" or remove it")
        from ratchet.tasks import task_from_spec

        if task_from_spec(self).step_limit is None:
            raise ValueError(f"[task] max_episode_steps: {self.env_id} has no time limit, so neither its episodes "
                             "nor the env-step budget would be bounded; set [task] max_episode_steps (env steps "
                             "per episode, e.g. 1000)")
        return self


class PolicySpec(_Section):
    """``[policy]``: what the run starts from (see :mod:`ratchet.policies`).

    ``kind = "program"`` (default): a policy file at ``path``. ``"mlp"``: a fresh network (``hidden``,
    ``activation``, ``normalize``; ``path`` unused), or with ``path`` ending in ``.npz`` the network in that
    weights file (as ``ratchet export`` writes it; ``hidden``/``activation``/``normalize`` then come from the
    file, and a ``hidden`` or ``activation`` set here that differs from the file's network is an error). ``"sb3"``: a Stable-Baselines3 model ``.zip`` at ``path`` (opened only in sandboxed workers), with
    ``normalization`` naming the ``VecNormalize`` statistics saved beside it when the model was trained in one.
    ``"residual"``: the program at ``path`` plus a learned correction network (``hidden``, ``activation``,
    ``normalize``) whose output layer starts at zero, so its correction is exactly zero at first.
    ``"source"``: the folder at ``path`` (source files in any language with marked regions), built by ``build`` and
    run by ``run`` in the sandbox (:mod:`ratchet.policies.source`).
    """

    kind: Literal["program", "mlp", "sb3", "residual", "source"] = Field(
        "program", description="What the run starts from: \"program\" a policy file (PARAMETERS + act); \"mlp\" a "
                               "feed-forward network (fresh, or the weights .npz at path); \"sb3\" a Stable-Baselines3 "
                               "model .zip; \"residual\" the program at path plus a learned correction network; "
                               "\"source\" a folder of source files in any language, built and run in the sandbox.")
    path: str = Field("policy.py", description="Policy file (program, residual base), model .zip (sb3), "
                                               "weights .npz (mlp; without one a fresh network) or the folder of a "
                                               "source policy, relative to the spec file.")
    files: list[str] = Field(default_factory=list, description="source only: the files of the folder that are the "
                                                               "candidate (paths relative to it); default every file.")
    build: list[str] = Field(default_factory=list, description="source only: shell command lines that build the "
                                                               "folder, run in order in a copy of it inside the "
                                                               "sandbox (e.g. [\"g++ -O2 -o prog main.cpp\"]).")
    run: list[str] = Field(default_factory=list, description="source only: the command (argv) that runs the built "
                                                             "program in its build folder, once per call of a task "
                                                             "function (e.g. [\"./prog\"]).")
    build_timeout_s: float = Field(60.0, gt=0, le=3600, description="source only: wall-clock limit of each build "
                                                                    "command (a compiler bomb is killed past it).",
                                   json_schema_extra={"unit": "s"})
    build_memory_mb: int = Field(2048, ge=64, le=1 << 20, description="source only: address-space limit of each "
                                                                      "build process.",
                                 json_schema_extra={"unit": "MiB"})
    max_output_bytes: int = Field(1 << 20, ge=1, le=1 << 28, description="source only: most bytes a program may "
                                                                          "print as one call's answer.",
                                  json_schema_extra={"unit": "bytes"})
    hidden: list[int] = Field(default_factory=lambda: [64, 64], description="Hidden layer sizes of an mlp policy "
                                                                           "or a residual correction.")
    activation: Literal["tanh", "relu"] = Field("tanh", description="Hidden-layer activation of an mlp policy or a "
                                                                    "residual correction.")
    normalize: Literal["bounds", "none"] = Field("bounds", description="Observation normalisation of a network: "
                                                                     "finite observation bounds mapped to [-1, 1].")
    normalization: str | None = Field(None, description="sb3 only: the VecNormalize statistics (.pkl, written by "
                                                        "VecNormalize.save) of a model trained in a VecNormalize, "
                                                        "relative to the spec file; unpickled only in sandboxed "
                                                        "workers. Observations are normalised with these frozen "
                                                        "statistics when acting and while fine-tuning.")

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, v: list[int]) -> list[int]:
        if not 1 <= len(v) <= 8 or any(not 1 <= h <= 4096 for h in v):
            raise ValueError("1 to 8 hidden layers of 1 to 4096 units each")
        return v

    @model_validator(mode="after")
    def _normalization(self) -> PolicySpec:
        if self.normalization is not None and self.kind != "sb3":
            raise ValueError(f"[policy] normalization (VecNormalize statistics) is for kind = \"sb3\", not "
                             f"{self.kind!r}; remove it")
        from ratchet.policy import FOLDER_KINDS

        folder_keys = [k for k in ("build", "run", "files") if getattr(self, k)]  # (every setting is written out in a ledger)
        if self.kind in FOLDER_KINDS:
            if not self.run:
                raise ValueError(f"[policy] kind = {self.kind!r} needs run = [...], the command that runs the built "
                                 "program (e.g. run = [\"./prog\"])")
        elif folder_keys:
            raise ValueError(f"[policy] {', '.join(folder_keys)}: only for kind = \"source\" (a folder built and run "
                             "in the sandbox); remove it")
        return self


class RefinerSpec(_Section, CMAESSettings):
    """``[refiner]``: when no ``[[refiners]]`` table is given, the one CMA-ES refiner's settings.

    ``train_episodes`` and ``gate_candidate`` are the loop's, not CMA-ES's: they live in ``[planner]`` (written
    here, as older specs do, they move there with a note; read here, they give the planner's values)."""

    kind: Literal["cmaes"] = Field("cmaes", description="[refiner] configures CMA-ES only; other kinds go in "
                                                        "[[refiners]] tables.")
    train_episodes: int = Field(5, ge=1, le=MAX_EPISODES, exclude=True,
                                description="Moved: [planner] train_episodes (this mirrors it).",
                                json_schema_extra={"unit": "episodes"})
    gate_candidate: Literal["mean", "best"] = Field("best", exclude=True,
                                                    description="Moved: [planner] gate_candidate (this mirrors it).")


class GateSpec(_Section):
    """``[gate]``: the promotion test on the fixed validation seeds."""

    alpha: float = Field(0.05, gt=0, lt=1, description="Significance level of the one-sided paired test.",
                         json_schema_extra={"unit": "probability"})
    test: Literal["t", "wilcoxon", "betting", "group-t", "exact"] = Field(
        "t", description="Paired test on the validation seeds: the paired t-test (about the mean return), the "
                         "Wilcoxon signed-rank test (rank based, robust to heavy tails), or a sequential test that "
                         "reads the validation seeds in batches and stops when the evidence decides: \"betting\" "
                         "(an e-process, valid for any distribution within return_range) or \"group-t\" "
                         "(group-sequential t-test). \"exact\" (the default of a [task] deterministic task, and "
                         "only there): one validation episode, better by more than tolerance, no statistics.")
    tolerance: float = Field(1e-9, ge=0, le=1, description="test = \"exact\": a candidate is promoted only when its "
                             "score beats the incumbent's by more than tolerance × max(1, |incumbent's score|) "
                             "(and min_improvement): rounding never promotes.",
                             json_schema_extra={"unit": "relative (return units below 1)"})
    validation_episodes: int = Field(50, ge=2, le=MAX_EPISODES, description="Number of fixed validation seeds "
                                     "(episodes per candidate at each gate; for sequential tests the most a "
                                     "decision may read).",
                                     json_schema_extra={"unit": "episodes"})
    batch: int = Field(10, ge=2, le=10_000, description="Sequential tests: validation seeds read per look.",
                       json_schema_extra={"unit": "episodes"})
    min_episodes: int = Field(20, ge=1, le=MAX_EPISODES, description="Sequential tests: seeds read before a "
                                                                     "futility stop.",
                              json_schema_extra={"unit": "episodes"})
    futility_t: float = Field(0.0, ge=-5, le=5, description="Sequential tests: reject once the running paired t "
                                                            "statistic is at most this (after min_episodes).")
    return_range: list[float] | None = Field(
        None, description="Betting test: (lowest, highest) episode return the task can give (return units); "
                          "default: 1.5 times the range of the training returns seen so far.",
                                             json_schema_extra={"unit": "return units"})
    min_improvement: float = Field(0.0, ge=0, description="Minimum mean paired gain to promote (return units).",
                                   json_schema_extra={"unit": "return units"})
    max_share: float = Field(0.3, gt=0, le=1, description="Largest share of the env-step budget spent on validation.",
                             json_schema_extra={"unit": "share of env steps"})
    spending: Literal["harmonic", "every", "none"] = Field(
        "harmonic", description="Alpha spending across a run's gate decisions: harmonic (α/(2k(k+1)) for the k-th "
                                "contested decision) and every (α/(k(k+1)) for the k-th tested one) keep the chance "
                                "of any false promotion in a run at most alpha (a promotion passes its level on to the "
                                "next decision: the fallback rule); none tests every decision at alpha.")
    max_new_failures: float | None = Field(
        None, ge=0, le=1, description="Reject a candidate that newly fails more than this share of the validation "
                                      "seeds the incumbent succeeds on, even if its mean is higher.",
                                           json_schema_extra={"unit": "share of seeds"})

    worse_against_any: float | None = Field(
        None, gt=0, lt=1, description="Game tasks: refuse a candidate significantly worse than the incumbent against "
                                      "any single validation opponent (one-sided paired t-test per opponent at this "
                                      "level over the number of opponents), even if it is better on average.",
                                            json_schema_extra={"unit": "probability"})

    def build(self) -> Any:
        """The gate these settings describe (:func:`ratchet.gate.make_gate`): a fixed-n
        :class:`~ratchet.gate.PairedTestGate` or a :class:`~ratchet.gate.SequentialGate`."""
        from ratchet.gate import make_gate

        if self.test == "exact":
            return make_gate("exact", self.alpha, min_improvement=self.min_improvement, tolerance=self.tolerance)
        sequential = self.test in ("betting", "group-t")
        return make_gate(self.test, self.alpha, min_improvement=self.min_improvement, spending=self.spending,
                         max_new_failures=self.max_new_failures,
                         **({"batch": self.batch, "min_episodes": self.min_episodes, "futility_t": self.futility_t,
                             "return_range": tuple(self.return_range) if self.return_range else None}
                            if sequential else {}))

    @model_validator(mode="after")
    def _can_promote(self) -> GateSpec:
        from ratchet.gate import spending_level

        level = spending_level(self.alpha, 1, self.spending)
        if self.return_range is not None:
            if len(self.return_range) != 2:
                raise ValueError(f"[gate] return_range must be [lowest, highest]; got {self.return_range}")
            lo, hi = self.return_range
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"[gate] return_range must be two finite numbers, lowest first; got [{lo}, {hi}]")
        if self.test == "betting":
            # even a bet of 0.9 of the capital won in full on every seed grows it at most 1.9-fold per seed
            need = math.ceil(math.log(1 / level) / math.log(1.9))
            if self.validation_episodes < need:
                raise ValueError(
                    f"[gate] validation_episodes = {self.validation_episodes} can never promote with test = "
                    f"\"betting\": even the first decision's e-value must reach 1/{level:.3g}, which takes at least "
                    f"{need} seeds (later decisions need more); set validation_episodes to 100–200 (the test stops "
                    "early when the evidence is clear)")
        if self.test == "wilcoxon":
            # the exact one-sided signed-rank test on n pairs never gives p below 1 / 2**n (all n differences
            # positive), and the gate promotes only when p < level
            need = 1
            while 0.5 ** need >= level:
                need += 1
            if self.validation_episodes < need:
                n = self.validation_episodes
                raise ValueError(
                    f"[gate] validation_episodes = {n} can never promote: the one-sided Wilcoxon test on {n} "
                    f"pairs gives p ≥ 1/2^{n} = {0.5 ** n:.3g}, never below the first decision's level "
                    f"{level:.3g} (alpha {self.alpha:g}, spending \"{self.spending}\"); set validation_episodes "
                    f"to at least {need}, or test = \"t\"")
        return self


class PlannerSpec(_Section):
    """``[planner]``: how each generation is planned — its training episodes, which contender goes to the
    gate, and where the training seeds come from."""

    train_episodes: int = Field(5, ge=1, le=MAX_EPISODES, description="Fresh training seeds per generation (episodes per candidate).",
                                json_schema_extra={"unit": "episodes"})
    gate_candidate: Literal["mean", "best"] = Field(
        "best", description="With decide = \"every\": send the best contender on the training seeds (CMA-ES samples and "
                        "mean) to the gate, or always the mean.")

    weakness_share: float = Field(0.0, ge=0, le=1, description="Share of each generation's training seeds drawn "
                                  "from seeds the incumbent failed on (weighted by how badly); 0 = fresh seeds only.",
                                  json_schema_extra={"unit": "share of seeds"})
    pool_size: int = Field(200, ge=1, le=1_000_000, description="Most seeds the weakness pool keeps.",
                           json_schema_extra={"unit": "seeds"})
    reject_duplicates: bool = Field(True, description="Refuse, before any episode runs, a proposal the run has "
                                    "already scored: the same candidate, or for a program the same code up to "
                                    "formatting, comments and docstrings with the same values; recorded as "
                                    "proposal_rejected and told to its refiner (an LLM's next prompt says so). false: "
                                    "evaluate it again on fresh seeds.")
    cascade_episodes: int = Field(0, ge=0, le=MAX_EPISODES, description="Cascade evaluation: every contender (of "
                                  "any refiner) and the incumbent first run this many of the generation's training "
                                  "seeds; a contender whose mean there is below the incumbent's mean on the same seeds "
                                  "minus cascade_margin × the incumbent's standard deviation over them (or that failed "
                                  "an episode) is dropped — recorded as proposal_rejected with the episodes and env "
                                  "steps it cost — and only the rest run the other seeds. 0 = off; else below "
                                  "train_episodes. The gate still reads only validation seeds.",
                                  json_schema_extra={"unit": "episodes"})
    cascade_margin: float = Field(1.0, ge=0, le=1e6, description="How far below the incumbent a contender's "
                                  "first-stage mean may be and go on, in units of the incumbent's standard deviation "
                                  "over the first-stage seeds (population std): 0 = it must at least match the "
                                  "incumbent there.", json_schema_extra={"unit": "incumbent standard deviations"})
    decide: Literal["powered", "every", "end", "exact"] = Field(
        "every", description="When the gate decides: \"exact\" (the default of a [task] deterministic task, and "
                               "only there): each generation's best, when its one score beats the incumbent's "
                               "by more than [gate] tolerance, confirmed by an exact re-evaluation; \"powered\" keeps the best candidates seen so far on a "
                               "shortlist and certifies one only when its expected gain makes the decision likely "
                               "to pass (power), and once more when the budget ends the search; \"end\" keeps the "
                               "shortlist and decides once, when the budget ends the search (the search spends the "
                               "budget as a plain optimisation loop would, then one certified pick); \"every\" gates "
                               "each generation's best contender that beats the incumbent on its training seeds.")
    final: bool = Field(True, description="With decide = \"every\": when the budget ends the search, confirm the "
                        "best candidates no gate has decided (the shortlist) on fresh training seeds with what the "
                        "budget leaves, and gate the best once more (decide = \"powered\" always does); the validation "
                        "kept for the next gate is then priced at the shortlist's and the incumbent's episode lengths "
                        "(not the longest seen), since a candidate left ungated still gets the final decision. "
                        "false: stop when the next generation and a validation at the longest lengths seen no longer fit.")
    overlap_gate: bool = Field(False, description="With decide = \"every\": validate a generation's contender in one "
                               "executor call with the next generation's training episodes, where nothing the verdict "
                               "says can change that generation: one refiner that proposes without the verdict "
                               "(cmaes with follow = \"own\", restarts = \"none\", not elitist), a task that "
                               "promotion does not change (no self-play league), no cascade, no [model] screen, no "
                               "[budget] target or wall_clock_s, patience not at its last generation, and room in the "
                               "budget for the whole validation, the next generation, its gate and one more incumbent "
                               "run. The same candidates and promotions as without it, save where the budget binds: "
                               "a promotion costs one extra run of the new incumbent on the next generation's "
                               "training seeds (the old one's, run ahead, is charged as re-evaluation), so the budget "
                               "may end the run a little sooner. Otherwise each generation waits for its gate.")
    power: float = Field(0.8, gt=0, lt=1, description="With decide = \"powered\": the chance of passing (normal "
                                                         "approximation, at the next decision's level) a candidate "
                                                         "needs before validation is spent on it before the end.",
                         json_schema_extra={"unit": "probability"})
    confirm_top: int = Field(3, ge=1, le=100, description="With decide = \"powered\" and for the final decision: the "
                                                           "shortlist's best this many are confirmed on fresh "
                                                           "training seeds before a decision.",
                             json_schema_extra={"unit": "candidates"})
    confirm_episodes: int | None = Field(None, ge=2, le=MAX_EPISODES, description=(
        "Fresh training seeds per confirmed candidate (and the incumbent, paired); default 4 × train_episodes, "
        "at most [gate] validation_episodes / (confirm_top + 2) (and at least 2). The final decision reads more: "
        "what the budget leaves once its validation is paid for."),
                                         json_schema_extra={"unit": "episodes"})

    @model_validator(mode="after")
    def _cascade_has_a_rest(self) -> PlannerSpec:
        if self.cascade_episodes >= self.train_episodes:
            raise ValueError(f"[planner] cascade_episodes = {self.cascade_episodes} leaves no second stage of "
                             f"[planner] train_episodes = {self.train_episodes}; set it below train_episodes (or 0 "
                             "for no cascade)")
        return self

    def confirm_seeds(self, validation_episodes: int) -> int:
        """Fresh training seeds per confirmed candidate in a round of confirmation (episodes): ``confirm_episodes``,
        or 4 × ``train_episodes`` capped so a round costs about one validation of ``validation_episodes``."""
        return self.confirm_episodes or max(2, min(4 * self.train_episodes, validation_episodes // (self.confirm_top + 2)))

    def confirmation_reserve(self, validation_episodes: int) -> int:
        """Episodes of the round of confirmation the search keeps in reserve with its validation (``decide =
        "powered"`` and ``"end"``; 0 for ``"every"`` and ``"exact"``): ``confirm_top`` + 2 candidates ×
        :meth:`confirm_seeds`."""
        if self.decide in ("every", "exact"):
            return 0
        return (self.confirm_top + 2) * self.confirm_seeds(validation_episodes)


class BudgetSpec(_Section):
    """``[budget]``: the run stops at whichever limit comes first."""

    env_steps: int | None = Field(None, gt=0, le=10**12, description="Env steps for training and validation "
                                  "episodes: every step taken to make a decision counts, whatever ended its episode.",
                                  json_schema_extra={"unit": "env steps"})
    episodes: int | None = Field(None, gt=0, le=10**9, description="Training and validation episodes.",
                                 json_schema_extra={"unit": "episodes"})
    wall_clock_s: float | None = Field(None, gt=0, le=10**8, description="Seconds of wall clock.",
                                       json_schema_extra={"unit": "seconds"})
    target: float | None = Field(None, description="Stop once the incumbent's validation mean reaches this.",
                                 json_schema_extra={"unit": "return units"})
    patience: int | None = Field(None, gt=0, le=1_000_000,
                                 description="Stop after this many generations without a promotion.",
                                 json_schema_extra={"unit": "generations"})
    money: float | None = Field(None, gt=0, le=10**9, description="Money the run's LLM requests may cost in all "
                                "(each priced by its refiner's price_prompt/price_completion before it is sent, at its "
                                "worst case): never exceeded.", json_schema_extra={"unit": "money (currency)"})
    currency: str = Field("USD", pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,15}$",
                          description="Unit of money; every refiner that prices its requests must name the same.")
    pricing: Literal["observed", "worst-case"] = Field(
        "observed", description="How work is priced against the env-step budget: \"observed\" (the mean episode "
                                "length seen plus 25 %, under the executor's hard cap) or \"worst-case\" (every "
                                "episode at the time limit: the last stretch of a budget may go unused).")

    @model_validator(mode="after")
    def _bounded(self) -> BudgetSpec:
        if self.env_steps is None and self.episodes is None and self.wall_clock_s is None:
            object.__setattr__(self, "env_steps", 100_000)
        return self


class TestSpec(_Section):
    """``[test]``: the final, report-only evaluation."""

    episodes: int = Field(100, ge=1, le=MAX_EPISODES, description="Number of test seeds (never used for selection).",
                          json_schema_extra={"unit": "episodes"})


class ExecutionSpec(_Section):
    """``[execution]``: where episodes run."""

    backend: Literal["process", "ray"] = Field(
        "process", description='"process": a local pool of sandboxed workers; "ray": Ray tasks (pip install ".[ray]").')
    address: str | None = Field(None, description='Ray only: "auto", "ray://host:10001", or unset to start a local Ray.')
    batch_episodes: int = Field(0, ge=0, le=MAX_EPISODES, description="Ray only: the most episodes per Ray task; 0 picks one from the batch.",
                                json_schema_extra={"unit": "episodes"})
    workers: int = Field(0, ge=0, le=MAX_WORKERS, description="Worker processes (process backend) or CPUs (local Ray); 0 means one "
                                              "per CPU core.",
                         json_schema_extra={"unit": "processes"})
    episode_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="Per-episode wall-clock limit (seconds).",
                                     json_schema_extra={"unit": "seconds"})
    lockstep_episodes: int = Field(LOCKSTEP_EPISODES, ge=1, le=4096, description="Episodes of one candidate each worker steps at once "
                                   "with trusted rollouts: one message to the policy process per round instead of one "
                                   "per env step; returns are the same as one at a time (1).",
                                   json_schema_extra={"unit": "episodes"})
    death_retries: int = Field(1, ge=0, le=10, description="Process backend: times an episode whose worker died (killed "
                                                          "from outside, out of memory, crashed) runs again on a fresh "
                                                          "worker before the death is the episode's error.",
                               json_schema_extra={"unit": "reruns"})
    training_timeout_s: float = Field(3600.0, gt=0, le=MAX_TIMEOUT_S,
                                      description="Wall-clock (and CPU-time) limit of one training job (seconds).",
                                      json_schema_extra={"unit": "seconds"})
    sandbox: bool = Field(True, description="Run policy code under resource limits, a scrubbed environment, a fresh "
                                            "temporary directory and (where the OS allows) no network.")
    require_isolation: bool = Field(False, description="Refuse to run unless policy code gets its own network "
                                                       "namespace.")
    memory_limit_mb: int = Field(Sandbox.memory_limit_mb, ge=1024, le=2**30, description="Address-space limit per worker process (MiB); "
                                                                     "a worker with Gymnasium loaded maps ≈ 0.5 GiB.",
                                 json_schema_extra={"unit": "MiB"})
    cpu_limit_s: int = Field(Sandbox.cpu_limit_s, ge=1, le=10**7, description="CPU-time limit per episode per worker process "
                                                               "(seconds).",
                             json_schema_extra={"unit": "seconds"})
    max_open_files: int = Field(Sandbox.max_open_files, ge=32, le=2**20, description="Open-file limit per worker process.",
                                json_schema_extra={"unit": "files"})
    max_processes: int = Field(Sandbox.max_processes, ge=8, le=2**16, description="Processes and threads a worker may hold at once, "
                                                               "its own included.",
                               json_schema_extra={"unit": "processes"})
    disk_limit_mb: int = Field(Sandbox.disk_limit_mb, ge=1, le=2**20, description="What one candidate may write "
                               "in all (MiB): with trusted rollouts under bubblewrap its folder is a tmpfs of this size, "
                               "emptied before the next candidate (memory, so a worker may use memory_limit_mb plus "
                               "this); every file is also bounded at 256 MiB.",
                               json_schema_extra={"unit": "MiB"})
    env_allowlist: list[str] = Field(default_factory=list, description="Extra environment variables passed to "
                                                                        "workers (beyond PATH, HOME, LANG, ...).")
    trusted_rollouts: bool = Field(Sandbox.trusted_rollouts, description="Step the environment in a trusted process "
                                   "outside the policy's sandbox (policy code cannot forge a return); false runs "
                                   "policy and env in one process (faster, but returns are only as honest as the "
                                   "policy).")


class LoggingSpec(_Section):
    """``[logging]``: where each generation's scalars go besides the ledger (see :mod:`ratchet.metrics`). The
    ledger stays the record; these are outputs made from it."""

    tensorboard: str | None = Field(
        None, min_length=1, description="Folder for TensorBoard event files, relative to the spec file's folder; "
                                        "each run writes to its own subfolder named by its run id (as "
                                        "Stable-Baselines3's tensorboard_log), with the run's env steps as "
                                        "global_step. Needs pip install \"policy-ratchet[logging]\".")


class ModelSpec(_Section):
    """``[model]``: a learned world model that screens candidates before they are run (:mod:`ratchet.worldmodel`).
    Off by default: see the docs page "World model: what it costs and when it helps" for the measurements."""

    screen: bool = Field(False, description="Screen each generation's proposals in a world model fitted on transitions "
                                            "recorded on the trusted side; only the best-ranked are run. Needs "
                                            "[execution] trusted_rollouts = true and a program policy.")
    factor: int = Field(2, ge=1, le=16, description="Proposals per candidate paid for in real episodes: the refiner "
                                                    "proposes factor times its population and the screen keeps the best "
                                                    "1/factor.", json_schema_extra={"unit": "proposals per candidate"})
    optimism: float = Field(1.0, ge=0, le=100, description="Bonus for what the ensemble disagrees on: a proposal is "
                                                           "ranked by its mean imagined return plus this many standard "
                                                           "deviations across the members.",
                            json_schema_extra={"unit": "standard deviations"})
    controls: int = Field(0, ge=0, le=16, description="Screened-out proposals run anyway each screened generation, "
                                                      "drawn at random (seeded): the screen is judged by whether what "
                                                      "it kept beats them (see judge); with 0 nothing judges it and it "
                                                      "stays on. Each costs a candidate's training episodes.",
                          json_schema_extra={"unit": "candidates"})
    record_episodes: int = Field(4, ge=1, le=1000, description="Training episodes per generation whose transitions "
                                                               "are recorded (the first ones run).",
                                 json_schema_extra={"unit": "episodes"})
    max_transitions: int = Field(20_000, ge=100, le=100_000, description="Most transitions the data set keeps (the "
                                                                         "newest).", json_schema_extra={"unit": "steps"})
    min_transitions: int = Field(200, ge=10, le=100_000, description="Transitions recorded before the screen starts "
                                                                     "choosing (until then see unscreened).",
                                 json_schema_extra={"unit": "steps"})
    unscreened: Literal["all", "kept"] = Field(
        "all", description="Generations before the model has min_transitions (the first): \"all\" runs every "
                           "proposal (factor times a screened generation's episodes), \"kept\" only as many as a "
                           "screened generation runs (the refiner's first ones, independent draws; the rest are told "
                           "to it ranked below them).")
    members: int = Field(5, ge=1, le=20, description="Networks in the ensemble.")
    hidden: int = Field(64, ge=4, le=1024, description="Units per hidden layer (two layers).")
    updates: int = Field(300, ge=10, le=100_000, description="Gradient steps per member each time the model is fitted.")
    horizon: int | None = Field(None, ge=1, le=10_000, description="Most imagined steps per imagined episode; unset: "
                                                                 f"the task's episode step limit, at most {HORIZON_CAP}.",
                                json_schema_extra={"unit": "env steps"})
    starts: int = Field(8, ge=1, le=256, description="Imagined episodes per proposal and member (recorded start "
                                                     "states).", json_schema_extra={"unit": "episodes"})
    judge: Literal["controls", "kept"] = Field(
        "controls", description="What switches the screen off. \"controls\": its advantage over the controls (the "
                                "rank-biserial correlation of 'kept' with the real training return over every pair of a "
                                "kept candidate and a control: (wins - losses) / pairs) is below min_correlation after "
                                "`window` generations with controls; with controls = 0 it stays on. \"kept\": the "
                                "mean rank correlation among the candidates that ran over `window` generations is below "
                                "min_correlation (biased low; the rule of runs recorded before this key).")
    min_correlation: float = Field(MIN_CORRELATION, ge=-1, le=1, description="The screen switches itself off when "
                                                                             "what `judge` reads is below this (0: no "
                                                                             "better than chance).")
    window: int = Field(WINDOW, ge=1, le=1000, description="Generations the screen is judged over before it may switch "
                                                           "itself off.", json_schema_extra={"unit": "generations"})


#: Episode budgets up to this size get defaults sized to them (see ``RunSpec._size_to_a_small_budget``).
SMALL_EPISODE_BUDGET = 1000


class RunSpec(_Section):
    """A whole run spec. ``base_dir`` (the spec file's folder) resolves relative paths."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
                      description="Run-id prefix: letters, digits, '.', '_', '-'.")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Run seed: fixes seed splits and the refiner's sampling.")
    task: TaskSpec
    policy: PolicySpec = PolicySpec()
    refiner: RefinerSpec = RefinerSpec()
    refiners: list[dict[str, Any]] = Field(
        default_factory=list, description="[[refiners]] tables: each a refiner kind (cmaes, ppo, residual, mutate, llm, dagger, "
                                          "hg-dagger, bc, cfr, or one registered by a package) with its settings; the planner allocates generations among them. Empty: one "
                                          "cmaes from [refiner] (a program policy), ppo (mlp, sb3) or residual.")
    planner: PlannerSpec = PlannerSpec()
    gate: GateSpec = GateSpec()
    budget: BudgetSpec = BudgetSpec()
    test: TestSpec = TestSpec()
    execution: ExecutionSpec = ExecutionSpec()
    logging: LoggingSpec = LoggingSpec()
    model: ModelSpec = ModelSpec()
    base_dir: str = Field(".", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _size_to_a_small_budget(cls, data: Any) -> Any:
        """Defaults sized to a small episode budget (``[budget] episodes`` ≤ 1000), for the settings the spec
        does not give: validation seeds ≈ budget / 12 (8–50), training seeds per generation ≈ budget / 64
        (2–5), population ≈ budget / 32 (at least 4; pycma's default from 384 episodes on), validation share
        up to 0.5. With 128 episodes on a short-episode task that is 10 validation episodes and generations
        of 12 episodes, so several gated generations fit instead of none. The sized values are what the
        ledger records."""
        if not isinstance(data, dict):
            return data
        data = _deterministic_defaults(_move_loop_settings(data))
        budget = data.get("budget")
        episodes = budget.get("episodes") if isinstance(budget, dict) else None
        if type(episodes) is not int or not 0 < episodes <= SMALL_EPISODE_BUDGET:
            return data
        gate = dict(data.get("gate") or {}) if isinstance(data.get("gate", {}), dict) else data.get("gate")
        refiner = dict(data.get("refiner") or {}) if isinstance(data.get("refiner", {}), dict) else data.get("refiner")
        if not isinstance(gate, dict) or not isinstance(refiner, dict):
            return data  # let field validation report the wrong type
        gate.setdefault("validation_episodes", min(50, max(8, episodes // 12)))
        gate.setdefault("max_share", 0.5)
        planner = dict(data.get("planner") or {}) if isinstance(data.get("planner", {}), dict) else data.get("planner")
        if not isinstance(planner, dict):
            return data
        planner.setdefault("train_episodes", min(5, max(2, episodes // 64)))
        if episodes // 32 < 12:
            model = data.get("model")
            screened = isinstance(model, dict) and model.get("screen") is True
            factor = model.get("factor", 2) if screened and isinstance(model, dict) else 1
            factor = factor if type(factor) is int and factor >= 1 else 1  # a bad one: field validation says so
            refiner.setdefault("popsize", factor * max(4, episodes // 32))  # the screen runs 1/factor of them
        return {**data, "gate": gate, "refiner": refiner, "planner": planner}

    @model_validator(mode="after")
    def _mirror_loop_settings(self) -> RunSpec:
        """``[refiner] train_episodes``/``gate_candidate`` read the ``[planner]`` values (older code reads them there)."""
        mirror = {k: getattr(self.planner, k) for k in _MOVED_TO_PLANNER}
        if any(getattr(self.refiner, k) != v for k, v in mirror.items()):
            object.__setattr__(self, "refiner", self.refiner.model_copy(update=mirror))
        return self

    @model_validator(mode="after")
    def _exact_only_when_deterministic(self) -> RunSpec:
        """``[planner] decide = "exact"`` and ``[gate] test = "exact"`` go together, and only with ``[task]
        deterministic = true`` (a noisy score needs the statistics); a deterministic task scores each candidate once."""
        exact = {"[planner] decide": self.planner.decide == "exact", "[gate] test": self.gate.test == "exact"}
        if self.task.deterministic:
            other = [f"{k} = \"{self.planner.decide if k.startswith('[planner]') else self.gate.test}\""
                     for k, on in exact.items() if not on]
            if other:
                raise ValueError(f"[task] deterministic = true decides without statistics: {', '.join(other)} does not "
                                 "apply; remove it (the default is \"exact\")")
            if self.planner.train_episodes != 1 or self.planner.weakness_share:
                raise ValueError(f"[task] deterministic = true scores each candidate once: remove [planner] "
                                 f"train_episodes = {self.planner.train_episodes} and weakness_share (the default is 1 "
                                 "and 0)")
        elif any(exact.values()):
            key = next(k for k, on in exact.items() if on)
            raise ValueError(f"{key} = \"exact\" needs [task] deterministic = true (a score that varies needs a "
                             "statistical test)")
        return self

    @model_validator(mode="after")
    def _end_decides_at_the_budget(self) -> RunSpec:
        """``decide = "end"`` promotes nothing until the budget ends the search: a target the incumbent's
        validation mean must reach, or a patience counted in generations without a promotion, would stop the
        run early and decide nothing."""
        if self.planner.decide == "end":
            for key in ("target", "patience"):
                if getattr(self.budget, key) is not None:
                    raise ValueError(f"[budget] {key} cannot be used with [planner] decide = \"end\" (nothing is "
                                     "promoted before the budget ends the search, so it would stop the run before "
                                     f"its one decision); remove [budget] {key} or use decide = \"every\"")
        return self

    @model_validator(mode="after")
    def _first_validation_fits(self) -> RunSpec:
        """The starting policy's validation runs before any budget decision, so the budget must pay for it."""
        from ratchet.tasks import task_from_spec

        n, b = self.gate.build().first_look(self.gate.validation_episodes), self.budget  # a sequential gate: one batch
        if b.episodes is not None and b.episodes < n:
            raise ValueError(f"[budget] episodes = {b.episodes:,} cannot pay for the starting policy's first "
                             f"validation ([gate] validation_episodes = {n:,} episodes); raise [budget] episodes "
                             f"above {n:,} (training needs more) or lower [gate] validation_episodes")
        task = task_from_spec(self.task)
        limit = task.step_limit
        if b.env_steps is not None and limit is not None and n * limit > b.env_steps:
            unit, why, knob = (("env steps", "the time limit", " or [task] max_episode_steps") if self.task.kind == "gym"
                               else (task.cost_unit, "the most an instance costs", ""))
            raise ValueError(f"[budget] env_steps = {b.env_steps:,} cannot pay for the starting policy's first "
                             f"validation: up to {n:,} episodes × {limit:,} {unit} ({why}) = "
                             f"{n * limit:,}; raise [budget] env_steps above {n * limit:,} or lower [gate] "
                             f"validation_episodes{knob}")
        return self

    @model_validator(mode="after")
    def _first_generation_fits(self) -> RunSpec:
        """``[budget] episodes`` must pay for one generation and its gate after the first validation: a run
        that can only validate the starting policy would spend its test episodes and improve nothing. The
        cheapest refiner's generation is counted from what the spec says: each kind's
        :attr:`~ratchet.refiners.registry.RefinerKind.generation_size` (CMA-ES its population, ``popsize``, pycma's
        default at least 4, and its distribution mean; ``mutate`` ``programs × variants``; ``llm`` ``proposals ×
        variants``; one proposal by default) and the incumbent on each training seed."""
        from ratchet.refiners.registry import refiner_kind

        b, g = self.budget, self.gate
        if b.episodes is None:
            return self
        built = g.build()
        first, gate = built.first_look(g.validation_episodes), built.price(g.validation_episodes)
        sizes = []
        for e in self.refiner_entries():
            kind = refiner_kind(e["kind"])
            size = kind.generation_size
            sizes.append(1 if size is None else size(kind.settings(**{k: v for k, v in e.items()
                                                                       if k not in ("kind", "name")})))
        policies = min(sizes) + 1
        train = self.planner.train_episodes
        confirm = self.planner.confirmation_reserve(g.validation_episodes)
        need = first + policies * train + gate + confirm
        if b.episodes < need:
            kept = f" + {confirm:,} for a round of confirmation" if confirm else ""
            raise ValueError(f"[budget] episodes = {b.episodes:,} cannot pay for a single generation: {first:,} for "
                             f"the starting policy's first validation + {policies * train:,} for a generation "
                             f"({policies} candidates × {train} training episodes) + {gate:,} for its gate{kept} = "
                             f"{need:,}; raise [budget] episodes to at least {need:,}, or lower the refiners' popsize / "
                             "[planner] train_episodes or [gate] validation_episodes")
        return self

    @field_validator("refiners")
    @classmethod
    def _refiner_tables(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from ratchet.refiners.registry import known_kinds, refiner_kind

        out = []
        for i, entry in enumerate(v):
            where = refiner_table(i)
            if not isinstance(entry, dict) or "kind" not in entry:
                raise ValueError(f"{where} needs kind = one of {', '.join(known_kinds())}")
            body = {k: x for k, x in entry.items() if k not in ("kind", "name")}
            try:
                kind = refiner_kind(str(entry["kind"]))
            except KeyError as exc:
                raise ValueError(f"{where}: {exc.args[0]}") from None
            name = entry.get("name")
            if name is not None and not (isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}", name)):
                raise ValueError(f"{where}: name must be 1-40 letters, digits, '.', '_', '-'")
            try:
                settings = kind.settings(**body)
            except ValidationError as exc:
                raise ValueError(refiner_setting_error(i, entry["kind"], kind.settings, exc)) from None
            out.append({"kind": entry["kind"], **({"name": name} if name else {}), **settings.model_dump(mode="json")})
        from ratchet.refiners.registry import arm_names

        names = arm_names(out)
        if len(set(names)) != len(names):
            raise ValueError("[[refiners]] names must be distinct")
        return out

    @model_validator(mode="after")
    def _refiners_fit_the_policy(self) -> RunSpec:
        from ratchet.refiners.registry import refiner_kind

        for i, entry in enumerate(self.refiner_entries()):
            kind = refiner_kind(entry["kind"])
            if self.policy.kind not in kind.policy_kinds:
                raise ValueError(f"refiner kind {entry['kind']!r} cannot refine a {self.policy.kind!r} policy "
                                 f"(it refines {', '.join(kind.policy_kinds)} policies); "
                                 f"{kind.hint or 'choose another [[refiners]] kind'}")
            settings = kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")})
            smallest = getattr(settings, "smallest_job_env_steps", None)  # a training refiner's smallest job
            if smallest and self.budget.env_steps is not None and smallest > self.budget.env_steps:
                raise ValueError(f"{refiner_table(i, entry['kind'])}: its smallest training job "
                                 f"({smallest:,} env steps) is more than the whole [budget] env_steps = "
                                 f"{self.budget.env_steps:,}, so it could never train; "
                                 f"{getattr(settings, 'smallest_job_hint', 'raise [budget] env_steps')}")
        return self

    def refiner_entries(self) -> list[dict[str, Any]]:
        """The run's refiners, one dict per ``[[refiners]]`` table (``kind``, optional ``name``, settings).
        Without tables: one ``cmaes`` from ``[refiner]`` for a program or source policy, ``ppo`` for mlp and sb3
        policies, ``residual`` for a residual policy."""
        from ratchet.policy import FOLDER_KINDS

        if self.refiners:
            return [dict(e) for e in self.refiners]
        if self.policy.kind == "program" or self.policy.kind in FOLDER_KINDS:
            r = self.refiner
            return [{"kind": "cmaes", **r.model_dump(mode="json", include=set(CMAESSettings.model_fields))}]
        from ratchet.refiners.registry import refiner_kind

        kind = "residual" if self.policy.kind == "residual" else "ppo"
        return [{"kind": kind, **refiner_kind(kind).settings().model_dump(mode="json")}]

    @property
    def policy_path(self) -> Path:
        """Absolute path of the policy file."""
        return (Path(self.base_dir) / self.policy.path).resolve()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (stored in the ledger)."""
        return self.model_dump(mode="json")


#: Loop-wide settings older specs wrote in ``[refiner]``; they belong to ``[planner]``.
_MOVED_TO_PLANNER = ("train_episodes", "gate_candidate")


def _deterministic_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """The defaults of a ``[task] deterministic = true`` spec: ``[planner] decide`` and ``[gate] test`` ``"exact"``,
    ``[planner] train_episodes`` and ``[test] episodes`` 1 (each candidate is scored once; the test is one more exact
    re-evaluation). Settings the spec gives are kept (and checked by ``RunSpec._exact_only_when_deterministic``)."""
    task = data.get("task")
    if not isinstance(task, dict) or task.get("deterministic") is not True:
        return data
    out = dict(data)
    for section, defaults in (("planner", {"decide": "exact", "train_episodes": 1}), ("gate", {"test": "exact"}),
                              ("test", {"episodes": 1})):
        table = out.get(section, {})
        if isinstance(table, dict):
            out[section] = {**defaults, **table}
    return out


def _refiner_beside_refiners(data: dict[str, Any]) -> str | None:
    """Why a spec file's ``[refiner]`` settings would be ignored, or None: the run's refiners are its ``[[refiners]]``
    tables when it has any (``train_episodes`` and ``gate_candidate``, the planner's, are allowed). Checked on the
    file and its ``--set`` overrides only: a validated spec's own dump carries every ``[refiner]`` field."""
    refiner, tables = data.get("refiner"), data.get("refiners")
    if not isinstance(refiner, dict) or not isinstance(tables, list) or not tables:
        return None
    ignored = [k for k in refiner if k not in _MOVED_TO_PLANNER]
    if not ignored:
        return None
    return (f"[refiner] {ignored[0]} has no effect: this spec's refiners are its [[refiners]] tables; set it in one "
            f"of them (--set refiners.0.{ignored[0]}=…) and drop it from [refiner]")


def _nul_in(data: Any, key: str = "") -> str | None:
    """Why a spec's text holds a NUL character, naming its setting (``policy.path``, ``refiners.0.demonstrations``),
    or None. No path, URL or name can hold one (the operating system refuses it), so it is refused where it is read."""
    if isinstance(data, str):
        return f"{key or 'a setting'} contains a NUL character (\\0); remove it" if "\0" in data else None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        if isinstance(k, str) and "\0" in k:
            return f"a setting's name contains a NUL character (\\0): {k!r}; remove it"
        why = _nul_in(v, f"{key}.{k}" if key else str(k))
        if why is not None:
            return why
    return None


def _move_loop_settings(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``[refiner] train_episodes``/``gate_candidate`` copied to ``[planner]`` (see
    :func:`moved_settings`); :meth:`RunSpec._mirror_loop_settings` makes ``[refiner]`` read the planner's values.

    Raises:
        ValueError: both tables set one of them, to different values.
    """
    refiner, planner = data.get("refiner", {}), data.get("planner", {})
    if not isinstance(refiner, dict) or not isinstance(planner, dict):
        return data  # let field validation report the wrong type
    refiner, planner = dict(refiner), dict(planner)
    for key in _MOVED_TO_PLANNER:
        if key in refiner and key in planner and refiner[key] != planner[key]:
            raise ValueError(f"[refiner] {key} = {refiner[key]!r} and [planner] {key} = {planner[key]!r}: keep only "
                             f"[planner] {key}")
        if key in refiner and key not in planner:
            planner[key] = refiner[key]
    return {**data, "refiner": refiner, "planner": planner}


def moved_settings(data: Any) -> list[str]:
    """One note per setting a spec's data writes where older specs kept it, naming the new key (``"note:
    [refiner] train_episodes is now [planner] train_episodes (read from [refiner] this time)"``)."""
    refiner = data.get("refiner") if isinstance(data, dict) else None
    planner = data.get("planner") if isinstance(data, dict) else None
    if not isinstance(refiner, dict):
        return []
    planner = planner if isinstance(planner, dict) else {}
    return [f"note: [refiner] {key} is now [planner] {key} (read from [refiner] this time)"
            for key in _MOVED_TO_PLANNER if key in refiner and key not in planner]


def unpriced_money(spec: RunSpec) -> list[str]:
    """A note when ``[budget] money`` is set but no refiner prices its requests (no ``price_prompt`` /
    ``price_completion``): nothing is ever drawn from it, so it limits nothing. Empty otherwise."""
    from ratchet.refiners.registry import refiner_kind

    b = spec.budget
    if b.money is None:
        return []
    for entry in spec.refiner_entries():
        kind = refiner_kind(entry["kind"])
        if kind.pays is not None and kind.pays(kind.settings(**{k: v for k, v in entry.items()
                                                                  if k not in ("kind", "name")})):
            return []
    return [(f"note: [budget] money = {b.money:g} {b.currency} limits nothing: no refiner prices its requests; set "
             f"price_prompt and price_completion ({b.currency} per million tokens) in the llm refiner's table")]


def _coerced_refiner_setting(data: Mapping[str, Any]) -> str | None:
    """Why a ``[[refiners]]`` table of a spec written by hand holds a value of the wrong type that lax validation
    would have coerced (``ahead = true`` read as 1, ``popsize = "8"`` as 8), in one line; None when every table is
    well typed. Checked as strictly as a ``[section]`` (pydantic's strict JSON mode: an integer for a float setting
    still passes). Only for specs a user wrote: a ledger's recorded spec holds what validation made of them."""
    import json

    from ratchet.refiners.registry import refiner_kind

    tables = data.get("refiners")
    for i, entry in enumerate(tables if isinstance(tables, list) else []):
        if not isinstance(entry, dict):
            continue
        body = {k: x for k, x in entry.items() if k not in ("kind", "name")}
        try:
            refiner_kind(str(entry.get("kind"))).settings.model_validate_json(json.dumps(body, default=str),
                                                                              strict=True)
        except ValidationError as exc:
            return refiner_setting_error(i, entry.get("kind"), refiner_kind(str(entry.get("kind"))).settings, exc)
        except KeyError:  # an unknown kind: validation said so already
            continue
    return None


def overlap_gate_unused(spec: RunSpec) -> list[str]:
    """A note when ``[planner] overlap_gate`` is on but a setting of the spec rules it out for the whole run
    (:class:`ratchet.overlap.GateOverlap`): every generation then waits for its gate, and the note says why. Empty
    otherwise (the refiner, the task, patience and the budget still decide each generation)."""
    p, b = spec.planner, spec.budget
    if not p.overlap_gate:
        return []
    why = [text for ruled_out, text in [
        (p.decide != "every", f'[planner] decide = "{p.decide}" (it needs "every")'),
        (len(spec.refiner_entries()) != 1, f"the run has {len(spec.refiner_entries())} refiners (it needs one)"),
        (p.cascade_episodes > 0, "[planner] cascade_episodes is set"),
        (spec.model.screen, "[model] screen is on"),
        (b.target is not None, "[budget] target is set (a stop the verdict decides)"),
        (b.wall_clock_s is not None, "[budget] wall_clock_s is set (a stop the clock decides)")] if ruled_out]
    if not why:
        return []
    return [(f"note: [planner] overlap_gate has no effect in this run: {'; '.join(why)}; every generation waits for "
             "its gate")]


def screen_unused_reasons(spec: RunSpec) -> list[str]:
    """Why the run can record no transitions for a world model, each in a few words: the task records none
    (:attr:`ratchet.tasks.Task.records_transitions`: an evaluator's instances, a game's moves) or ``[execution]
    trusted_rollouts = false`` (only the trusted env host records them). Empty when it can (whether or not
    ``[model] screen`` is on)."""
    from ratchet.tasks import kind_class

    return [text for ruled_out, text in [
        (not kind_class(spec.task.kind or "gym").records_transitions,  # declared by the kind: no task is built
         (f"the task ({spec.task.kind}) records no transitions for a world model (no environment stepped on the "
          "trusted side)")),
        (not spec.execution.trusted_rollouts,
         "[execution] trusted_rollouts = false (only the trusted env host records transitions)")] if ruled_out]


def screen_unused(spec: RunSpec) -> list[str]:
    """A note when ``[model] screen`` is on but the run can record no transitions for its world model
    (:func:`screen_unused_reasons`). The screen then never has ``min_transitions``, so it screens no generation
    (``ratchet show`` says so too: :meth:`ratchet.ledger.projection.RunState.world_model`'s ``unused``). Empty
    otherwise."""
    if not spec.model.screen:
        return []
    why = screen_unused_reasons(spec)
    if not why:
        return []
    return [(f"note: [model] screen has no effect in this run: {'; '.join(why)}; no generation is screened ([model] "
             f"unscreened = \"{spec.model.unscreened}\" says which proposals run); remove screen = true")]


_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def refiner_table(i: int, kind: object = None) -> str:
    """The ``[[refiners]]`` table at index ``i`` (from 0, as ``--set refiners.0.KEY=…`` counts) for messages:
    ``"the first [[refiners]] table (refiners.0, llm)"``; the kind only where given."""
    nth = _ORDINALS[i] if 0 <= i < len(_ORDINALS) else f"#{i + 1}"
    return f"the {nth} [[refiners]] table (refiners.{i}{f', {kind}' if kind is not None else ''})"


def refiner_setting_error(i: int, kind: object, settings: type[BaseModel], exc: ValidationError) -> str:
    """One line for ``exc``'s first error validating the ``[[refiners]]`` table at index ``i`` (of ``kind``,
    whose settings model is ``settings``): an unknown key names the keys allowed there, as in a ``[section]``."""
    e = exc.errors()[0]
    key = ".".join(map(str, e["loc"]))
    if e["type"] == "extra_forbidden":
        allowed = ["kind", "name", *settings.model_fields]
        return f"{refiner_table(i, kind)}: unknown key {key}; allowed keys here: {', '.join(allowed)}"
    return f"{refiner_table(i, kind)}: {key}: {e['msg']}"


def _format_error(err: Mapping[str, Any], where: str) -> str:
    loc = [str(x) for x in err["loc"]]
    section, key = (loc[0], ".".join(loc[1:])) if len(loc) > 1 else ("", loc[0] if loc else "")
    name = f"[{section}] {key}" if section and key else (section or key)
    if err["type"] == "extra_forbidden":
        parent = RunSpec.model_fields.get(section) if section and key else None
        model = parent.annotation if parent is not None else RunSpec
        allowed = [k for k in getattr(model, "model_fields", {}) if k != "base_dir"]
        return f"{where}: unknown key {name}; allowed keys here: {', '.join(allowed)}"
    if err["type"] == "missing":
        if loc == ["task"]:
            return f"{where}: missing [task] section; add [task] with env_id = \"CartPole-v1\" (or another Gymnasium id)"
        if loc[-1] == "env_id":
            return f"{where}: missing [task] env_id; set it to a Gymnasium id such as \"CartPole-v1\""
        return f"{where}: missing required key {name}"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error" and len(loc) <= 1 and isinstance(err.get("input"), dict):
        return f"{where}: {msg}"  # a check across keys (a model validator): its message names the keys
    if err["type"] == "value_error" and loc == ["refiners"]:
        return f"{where}: {msg}"  # its message names the [[refiners]] table (refiner_table)
    if err["type"] in _BOUND_ERRORS:
        msg = _allowed_range(section, key) or msg
    got = err.get("input")
    # a table or a list of tables is not echoed: too long to help, and [[refiners]] may name endpoints
    got_txt = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    return f"{where}: {name}: {msg}{got_txt}"


_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _allowed_range(section: str, key: str) -> str | None:
    """``"must be ≥ 2 and ≤ 100000"`` for a bounded key (None when its bounds are not found)."""
    model = RunSpec.model_fields[section].annotation if section in RunSpec.model_fields else None
    field = getattr(model, "model_fields", {}).get(key) if section else RunSpec.model_fields.get(key)
    if field is None:
        return None
    words = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    parts = [f"{words[attr]} {_number(getattr(m, attr))}" for m in field.metadata for attr in words if hasattr(m, attr)]
    return f"must be {' and '.join(parts)}" if parts else None


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def spec_from_dict(data: dict[str, Any], base_dir: str | Path = ".", where: str = "spec") -> RunSpec:
    """Validate a spec given as a dict.

    Raises:
        SpecError: the first problem, in one line naming the key and the fix.
    """
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a table of settings")
    if "base_dir" in data:
        raise SpecError(f"{where}: unknown key base_dir; paths are relative to the spec file's folder")
    nul = _nul_in(data)
    if nul is not None:  # before any path is resolved: the operating system refuses it there
        raise SpecError(f"{where}: {nul}")
    task = data.get("task")
    if isinstance(task, dict) and isinstance(task.get("evaluator"), str) and task["evaluator"]:
        data = {**data, "task": {**task, "evaluator": str((Path(base_dir) / task["evaluator"]).resolve())}}
    logging = data.get("logging")
    if isinstance(logging, dict) and isinstance(logging.get("tensorboard"), str) and logging["tensorboard"]:
        folder = (Path(base_dir) / Path(logging["tensorboard"]).expanduser()).resolve()
        data = {**data, "logging": {**logging, "tensorboard": str(folder)}}
    if isinstance(task, dict) and isinstance(task.get("opponents"), dict):
        data = {**data, "task": {**data["task"], "opponents": {
            name: _resolved_opponent(entry, base_dir) for name, entry in task["opponents"].items()}}}
    try:
        return RunSpec(**{**data, "base_dir": str(base_dir)})
    except ValidationError as exc:
        raise SpecError(_format_error(exc.errors()[0], where)) from None
    except TypeError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _resolved_opponent(entry: Any, base_dir: str | Path) -> Any:
    """An opponent entry of ``[task.opponents]`` with its path resolved against the spec's folder."""
    if isinstance(entry, str) and entry:
        return str((Path(base_dir) / entry).resolve())
    if isinstance(entry, dict) and isinstance(entry.get("path"), str) and entry["path"]:
        return {**entry, "path": str((Path(base_dir) / entry["path"]).resolve())}
    return entry


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` (a spec as read from TOML) with ``SECTION.KEY=VALUE`` (or top-level ``KEY=VALUE``) settings
    applied, as ``ratchet run --set`` gives them. ``VALUE`` is a TOML value (``0.1``, ``true``,
    ``"betting"``, ``[1, 2]``); a bare word that is not one is taken as a string. A ``[[refiners]]`` table is
    named by its index, counting from 0: ``refiners.0.env_steps=5000`` (``refiners[0].env_steps`` also
    works). The result is validated like the file itself, so a bad key or value is reported with its name.

    Raises:
        SpecError: an override without ``=``, naming a key below a value that is not a table, or a
            ``[[refiners]]`` index the spec does not have.
    """
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for item in overrides:
        key, eq, raw = item.partition("=")
        key = re.sub(r"\[(\d+)\]", r".\1", key.strip())  # refiners[0].x → refiners.0.x
        if not eq or not key or any(not part for part in key.split(".")):
            raise SpecError(f"--set {item!r}: write SECTION.KEY=VALUE, e.g. --set gate.validation_episodes=100")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        *sections, name = key.split(".")
        node: Any = out
        path = ""
        for section in [*sections, None]:
            if isinstance(node, list):  # an array of tables: the next part is an index
                n = len(node)
                tables = f"{n} [[{path}]] table{'s' if n != 1 else ''}"
                index = name if section is None else section
                if not index.isdigit():
                    raise SpecError(f"--set {item!r}: {path} is a list of [[{path}]] tables; name one by its "
                                    f"index from 0, e.g. --set {path}.0.KEY=VALUE (the spec has {tables})")
                if int(index) >= n:
                    raise SpecError(f"--set {item!r}: {path}.{index}: the spec has {tables}"
                                    + (f", indexed 0 to {n - 1}" if n else "; add one to the spec file first"))
                if section is None:
                    raise SpecError(f"--set {item!r}: {path}.{index} is a [[{path}]] table; set one key in it: "
                                    f"--set {path}.{index}.KEY=VALUE")
                child = node[int(index)]
                if not isinstance(child, dict):
                    raise SpecError(f"--set {item!r}: {path}.{index} is a value, not a table")
                node[int(index)] = child = dict(child)
            elif section is None:
                break
            else:
                if path == "" and section == "refiners" and section not in node:
                    node[section] = []  # no [[refiners]] tables yet: refiners.N is then out of range
                child = node.setdefault(section, {})
                if isinstance(child, list) and all(isinstance(x, dict) for x in child) and path == "":
                    node[section] = child = list(child)  # [[refiners]]
                    node, path = child, section
                    continue
                if not isinstance(child, dict):
                    raise SpecError(f"--set {item!r}: {section} is a value, not a [section]")
                node[section] = child = dict(child)
            node = child
            path = f"{path}.{section}" if path else section
        node[name] = value
    return out


def _blame_overrides(data: dict[str, Any], overrides: Sequence[str], seed: int | None, base_dir: Path, where: str,
                     message: str) -> str:
    """The error ``message`` (from validating the file with ``overrides`` and ``seed`` applied), said about
    the ``--set`` that brought it in when the file alone does not have it."""
    def error_of(items: Sequence[str]) -> str | None:
        d = apply_overrides(data, items)
        if seed is not None:
            d["seed"] = seed
        ignored = _refiner_beside_refiners(d)  # load_spec checks it first, before validation
        if ignored:
            return f"{where}: {ignored}"
        try:
            spec_from_dict(d, base_dir, where)
        except SpecError as exc:
            return str(exc)
        return None

    if error_of(()) == message:
        return message
    for k in range(1, len(overrides) + 1):
        if error_of(overrides[:k]) == message:
            return f"--set {overrides[k - 1]!r}" + message.removeprefix(where)
    return f"--set {' '.join(overrides)!r}" + message.removeprefix(where)


def load_spec(path: str | Path, overrides: Sequence[str] = (), seed: int | None = None,
              notes: list[str] | None = None) -> RunSpec:
    """Read and validate a spec file, or a directory containing ``ratchet.toml``.

    Args:
        path: The spec file or its folder.
        overrides: ``SECTION.KEY=VALUE`` settings applied on top of the file (:func:`apply_overrides`).
        seed: The run seed, instead of the file's ``seed``.
        notes: Where to append one line per setting written where older specs kept it (:func:`moved_settings`), and
            one for a ``[budget] money`` no refiner draws on (:func:`unpriced_money`) or an ``overlap_gate`` the spec
            rules out (:func:`overlap_gate_unused`), or a ``[model] screen`` with no transitions to learn from
            (:func:`screen_unused`).

    Raises:
        SpecError: missing file, TOML syntax error (with line), unknown key, wrong type, missing or
            unknown env id, a missing policy file, or a ``[logging] tensorboard`` folder that cannot be
            written (or tensorboardX not installed).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "ratchet.toml"
    if not p.is_file():
        raise SpecError(f"spec not found: {p} (give a ratchet.toml file or a folder that holds one)")
    if p.suffix == ".py":
        raise SpecError(f"{p} is a Python file; `ratchet run` takes a ratchet.toml spec (its [policy] path names "
                        "the policy file); to just score a policy use `ratchet evaluate POLICY.py --env ID`")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{p}: invalid TOML: {exc}") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise SpecError(f"{p}: cannot read the spec as UTF-8 text ({type(exc).__name__}); give a ratchet.toml file") from None
    file_data, data = data, apply_overrides(data, overrides)
    ignored = _refiner_beside_refiners(data)
    if ignored:
        message = f"{p}: {ignored}"
        raise SpecError(_blame_overrides(file_data, overrides, seed, p.parent.resolve(), str(p), message)
                        if overrides else message)
    if notes is not None:
        notes += moved_settings(data)
    if seed is not None:
        data["seed"] = seed
    try:
        spec = spec_from_dict(data, p.parent.resolve(), str(p))
    except SpecError as exc:
        if not overrides:
            raise
        raise SpecError(_blame_overrides(file_data, overrides, seed, p.parent.resolve(), str(p), str(exc))) from None
    coerced = _coerced_refiner_setting(data)
    if coerced is not None:  # a fresh spec only: a recorded one holds the settings as validated, well typed
        raise SpecError(f"{p}: {coerced}")
    if notes is not None:
        notes += unpriced_money(spec) + overlap_gate_unused(spec) + screen_unused(spec)
    from ratchet.policy import FOLDER_KINDS

    if spec.policy.kind in FOLDER_KINDS:
        if not spec.policy_path.is_dir():
            raise SpecError(f"{p}: [policy] path: folder not found: {spec.policy_path}; point it at the folder of "
                            "your program's source files")
    elif spec.policy.kind != "mlp" and not spec.policy_path.is_file():  # an mlp policy starts from no file
        what = "model .zip" if spec.policy.kind == "sb3" else "policy .py file"
        path_set = [o for o in overrides if o.partition("=")[0].strip() == "policy.path"]
        where = f"--set {path_set[-1]!r}" if path_set else str(p)
        raise SpecError(f"{where}: [policy] path: file not found: {spec.policy_path}; point it at your {what}")
    from ratchet.metrics import check_logging

    set_here = [o for o in overrides if o.partition("=")[0].strip() == "logging.tensorboard"]
    check_logging(spec.logging.tensorboard, f"--set {set_here[-1]!r}" if set_here else str(p))
    from ratchet.refiners.registry import arm_names, refiner_kind

    entries = spec.refiner_entries()
    for entry, name in zip(entries, arm_names(entries)):
        kind = refiner_kind(entry["kind"])
        if kind.files is not None:
            settings = kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")})
            for f in kind.files(settings):
                if not (p.parent / f).is_file():
                    raise SpecError(f"{p}: [[refiners]] {name}: file not found: {(p.parent / f).resolve()}; paths "
                                    "are relative to the spec file's folder")
    return spec
