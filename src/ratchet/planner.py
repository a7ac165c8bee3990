"""The planner: seed splits, budget accounting and what the next step of a run does."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ratchet.critic import Evaluation
from ratchet.policy import Candidate

from ratchet.spec import BudgetSpec

__all__ = ["SeedSplits", "Usage", "Budget", "Plan", "IncumbentPlanner"]

_SPLIT_CODE = {"train": 0, "validation": 1, "test": 2}


class SeedSplits:
    """Three disjoint seed splits derived from the run seed.

    Seed ``i`` of a split is ``3 * h + code`` with ``h`` a 30-bit hash of (run seed, split, i) and
    ``code`` 0/1/2 for train/validation/test, so the splits can never share a seed.

    Args:
        run_seed: The run's seed (non-negative int).
    """

    def __init__(self, run_seed: int) -> None:
        self.run_seed = int(run_seed)

    def seed(self, split: str, index: int) -> int:
        """Seed number ``index`` of ``split`` (``"train"``, ``"validation"`` or ``"test"``)."""
        digest = hashlib.sha256(f"ratchet/{self.run_seed}/{split}/{index}".encode()).digest()
        return 3 * (int.from_bytes(digest[:4], "little") >> 2) + _SPLIT_CODE[split]

    def seeds(self, split: str, start: int, count: int) -> list[int]:
        """``count`` distinct seeds of ``split`` beginning at index ``start``."""
        out: list[int] = []
        seen: set[int] = set()
        i = start
        while len(out) < count:
            s = self.seed(split, i)
            if s not in seen:
                seen.add(s)
                out.append(s)
            i += 1
        return out


@dataclass
class Usage:
    """What a run has spent on decisions (training and validation; test episodes are not counted).

    Attributes:
        env_steps: Env steps.
        episodes: Episodes.
        validation_env_steps: The part of ``env_steps`` spent on validation.
        wall_clock_s: Seconds since the run started (summed over resumed sessions).
    """

    env_steps: int = 0
    episodes: int = 0
    validation_env_steps: int = 0
    wall_clock_s: float = 0.0


class Budget:
    """Stop rules: env steps, episodes, wall clock, target score, patience — whichever comes first."""

    def __init__(self, spec: BudgetSpec) -> None:
        self.spec = spec

    def can_afford(self, usage: Usage, env_steps: float, episodes: int) -> bool:
        """Whether spending (an estimate of) ``env_steps`` and ``episodes`` more stays within budget."""
        s = self.spec
        if s.env_steps is not None and usage.env_steps + env_steps > s.env_steps:
            return False
        if s.episodes is not None and usage.episodes + episodes > s.episodes:
            return False
        return True

    def stop_reason(self, usage: Usage, incumbent_validation_mean: float, stale_generations: int,
                    *, check_clock: bool = True) -> str | None:
        """Why the run must stop now, or None to go on."""
        s = self.spec
        if s.target is not None and incumbent_validation_mean >= s.target:
            return f"target reached (incumbent validation mean {incumbent_validation_mean:.2f} ≥ {s.target:g})"
        if s.patience is not None and stale_generations >= s.patience:
            return f"patience: {stale_generations} generations without a promotion"
        if s.env_steps is not None and usage.env_steps >= s.env_steps:
            return "env-step budget used"
        if s.episodes is not None and usage.episodes >= s.episodes:
            return "episode budget used"
        if check_clock and s.wall_clock_s is not None and usage.wall_clock_s >= s.wall_clock_s:
            return "wall-clock budget used"
        return None


@dataclass(frozen=True)
class Plan:
    """One generation's plan.

    Attributes:
        generation: 1-based generation number.
        train_seeds: Fresh training seeds, shared by every candidate (common random numbers).
    """

    generation: int
    train_seeds: tuple[int, ...]


class IncumbentPlanner:
    """Refine the incumbent on fresh training seeds; gate whenever the budget can afford it.

    Each generation draws ``train_episodes`` new training seeds. A candidate goes to the gate when
    it beat the incumbent on this generation's training seeds and the validation it needs keeps
    validation within ``max_share`` of all env steps spent (and within the budget).

    Args:
        splits: The run's seed splits.
        train_episodes: Training seeds per generation.
        max_share: Largest share of env steps to spend on validation, in (0, 1].
        budget: The run's budget.
        gate_choice: ``"mean"`` or ``"best"``; see :meth:`gate_candidate`.
    """

    def __init__(self, splits: SeedSplits, train_episodes: int, max_share: float, budget: Budget,
                 gate_choice: str = "best") -> None:
        self.splits, self.train_episodes, self.max_share, self.budget = splits, train_episodes, max_share, budget
        self.gate_choice = gate_choice

    def plan(self, generation: int) -> Plan:
        """Plan ``generation`` (1-based)."""
        start = (generation - 1) * self.train_episodes
        return Plan(generation, tuple(self.splits.seeds("train", start, self.train_episodes)))

    def can_afford_generation(self, usage: Usage, n_candidates: int, est_episode_steps: float,
                              step_limit: int | None = None) -> bool:
        """Whether one more generation surely fits the budget.

        With a known episode ``step_limit`` (the env's time limit) the worst case must fit, so the
        env-step budget is a hard cap; without one, the estimate plus a 25 % margin must fit.
        """
        n_eps = n_candidates * self.train_episodes
        cost = n_eps * step_limit if step_limit else 1.25 * n_eps * est_episode_steps
        return self.budget.can_afford(usage, cost, n_eps)

    def gate_candidate(self, contenders: Sequence[Candidate], recommended: Candidate | None,
                       train: Mapping[str, Evaluation], incumbent: Candidate) -> Candidate | None:
        """Which contender to send to the gate.

        With ``gate_candidate="mean"`` it is the refiner's recommendation (CMA-ES's
        distribution mean): it was not selected on these training seeds, so its training score is
        unbiased, and in noisy problems the mean is the better estimate of the optimum. Before the
        refiner has a recommendation, or with ``"best"`` (default), it is the contender with the highest
        training mean. Contenders with errored episodes are never chosen.
        """
        clean = [c for c in contenders if train[c.id].n_errors == 0]
        if self.gate_choice == "mean" and recommended is not None and recommended in clean:
            return recommended
        return max(clean, key=lambda c: train[c.id].mean, default=None)

    @staticmethod
    def worth_gating(candidate_train: Evaluation, incumbent_train: Evaluation, incumbent_validation_mean: float) -> bool:
        """Screen before spending validation episodes on a candidate.

        The candidate must do at least as well as the incumbent on this generation's training seeds
        (paired, same seeds; ties count because both may sit at the return ceiling, as in CartPole's
        500) and score above the incumbent's validation mean, the lower-noise estimate of the
        incumbent's expected return. The second condition matters once the incumbent is good: the
        best of a population on a few seeds beats it on those seeds by luck alone quite often, and
        each such gate costs a full validation (measured on lunar_lander, run seeds 0–2: test means
        281.4 / 288.4 / 273.8 with both conditions vs 273.2 / 283.5 / 273.8 with the paired one only).
        """
        diff = float(np.mean(candidate_train.returns - incumbent_train.returns))
        return diff >= 0 and candidate_train.mean > incumbent_validation_mean

    def should_gate(self, usage: Usage, n_validation: int, est_episode_steps: float,
                    next_generation_steps: float = 0.0, step_limit: int | None = None) -> bool:
        """Whether to validate one candidate now.

        Yes when the budget surely affords it (worst case when ``step_limit`` is known) and either
        validation stays within ``max_share`` of all env steps, or this is the last chance: after
        it the budget could not pay for another generation (``next_generation_steps``).
        """
        cost = n_validation * est_episode_steps
        worst = n_validation * step_limit if step_limit else cost
        if not self.budget.can_afford(usage, worst, n_validation):
            return False
        if usage.validation_env_steps + cost <= self.max_share * (usage.env_steps + cost):
            return True
        after = Usage(usage.env_steps + int(cost), usage.episodes + n_validation, usage.validation_env_steps,
                      usage.wall_clock_s)
        return not self.budget.can_afford(after, next_generation_steps, 0)
