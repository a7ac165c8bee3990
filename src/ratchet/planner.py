"""The planner: seed splits, budget accounting and what the next step of a run does."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Self

import numpy as np

from ratchet.critic import Evaluation
from ratchet.policy import Candidate
from ratchet.refiners.base import Refiner
from ratchet.spec import BudgetSpec

__all__ = ["NO_GENERATION", "Budget", "IncumbentPlanner", "Plan", "Pricing", "SeedSplits", "Stop", "StopKind", "Usage",
           "WeaknessPool"]

_SPLIT_CODE = {"train": 0, "validation": 1, "test": 2}


class SeedSplits:
    """Three disjoint seed splits derived from the run seed.

    Seed ``i`` of a split is ``3 * h + code`` with ``h`` a 30-bit hash of (run seed, split, i) and
    ``code`` 0/1/2 for train/validation/test, so the splits can never share a seed. With ``pools`` (a data
    set's instances, :meth:`ratchet.tasks.Task.seed_pools`) a split's seeds are its own pool in an order
    shuffled by the run seed, repeating after ``len(pool)`` seeds.

    Args:
        run_seed: The run's seed (non-negative int).
        pools: Split -> the seeds it may use, or None for any seed.
    """

    def __init__(self, run_seed: int, pools: Mapping[str, Sequence[int]] | None = None) -> None:
        self.run_seed = int(run_seed)
        self.pools: dict[str, list[int]] | None = None
        if pools is not None:
            self.pools = {}
            for split, pool in pools.items():
                keyed = [(hashlib.sha256(f"ratchet/{self.run_seed}/{split}/pool/{s}".encode()).digest(), int(s))
                         for s in pool]
                self.pools[split] = [s for _, s in sorted(keyed)]

    def seed(self, split: str, index: int) -> int:
        """Seed number ``index`` of ``split`` (``"train"``, ``"validation"`` or ``"test"``)."""
        if self.pools is not None:
            pool = self.pools[split]
            return pool[index % len(pool)]
        digest = hashlib.sha256(f"ratchet/{self.run_seed}/{split}/{index}".encode()).digest()
        return 3 * (int.from_bytes(digest[:4], "little") >> 2) + _SPLIT_CODE[split]

    def seeds(self, split: str, start: int, count: int) -> list[int]:
        """``count`` distinct seeds of ``split`` beginning at index ``start`` (with pools: distinct as long as
        ``count`` is at most the pool's size)."""
        if self.pools is not None:
            return [self.seed(split, i) for i in range(start, start + count)]
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

    def check_sizes(self, validation: int, test: int, train: int = 0) -> None:
        """Refuse held-out splits larger than their pools (a data set's instances would repeat, and the gate's
        episodes would not be independent).

        Raises:
            TaskError: ``validation`` or ``test`` exceeds the instances of its split, or ``train`` (training episodes
                per candidate) the training instances.
        """
        from ratchet.errors import TaskError

        if self.pools is None:
            return
        for split, n, key in (("validation", validation, "[gate] validation_episodes"), ("test", test, "[test] episodes"),
                              ("train", train, "[planner] train_episodes")):
            if n > len(self.pools[split]):
                raise TaskError(f"{key} = {n} but the data set has {len(self.pools[split])} {split} instances; "
                                f"set {key} to at most {len(self.pools[split])} (or give the evaluator more instances)")


@dataclass
class Usage:
    """What a run has spent on decisions (training and validation; test episodes are not counted).

    Attributes:
        env_steps: Env steps.
        episodes: Episodes.
        validation_env_steps: The part of ``env_steps`` spent on validation.
        wall_clock_s: Seconds since the run started (summed over resumed sessions).
        reeval_env_steps: The part of ``env_steps`` spent re-running the incumbent and the refiner's
            recommendation on each generation's training seeds (the rest of the training steps is search).
        training_env_steps: The part of ``env_steps`` spent by refiners' training jobs (PPO updates).
    """

    env_steps: int = 0
    episodes: int = 0
    validation_env_steps: int = 0
    wall_clock_s: float = 0.0
    reeval_env_steps: int = 0
    training_env_steps: int = 0

    def breakdown(self, budget_env_steps: int | None) -> dict[str, int | None]:
        """Where the env steps went: ``search``, ``re-evaluation``, ``validation`` and ``unused`` (of the
        env-step budget; None without one)."""
        search = self.env_steps - self.validation_env_steps - self.reeval_env_steps - self.training_env_steps
        unused = None if budget_env_steps is None else max(0, budget_env_steps - self.env_steps)
        out = {"search": search, "re-evaluation": self.reeval_env_steps, "validation": self.validation_env_steps,
               "unused": unused}
        if self.training_env_steps:
            out = {"training": self.training_env_steps, **out}
        return out


class StopKind(str, Enum):
    """What ended a run's search (recorded as ``stop_kind`` in ``run_finished``)."""

    BUDGET = "budget"      # the env-step or episode budget: nothing more fits
    CLOCK = "clock"        # [budget] wall_clock_s
    TARGET = "target"      # [budget] target reached
    PATIENCE = "patience"  # [budget] patience: generations without a promotion
    IDLE = "idle"          # the refiner has nothing more to propose (e.g. its rounds are done, its training failed)
    BROKEN = "broken"      # the starting policy, or a whole generation, failed before any env step


class Stop(str):
    """Why a run stops: the one line it records and prints (a ``str``), with its :class:`StopKind` as ``kind``, so
    what follows a stop (the final decision) depends on what stopped the run, never on its wording."""

    kind: StopKind

    def __new__(cls, kind: StopKind, text: str) -> Self:
        out = super().__new__(cls, text)
        out.kind = kind
        return out


class Budget:
    """Stop rules: env steps, episodes, wall clock, target score, patience — whichever comes first."""

    def __init__(self, spec: BudgetSpec) -> None:
        self.spec = spec

    def can_afford(self, usage: Usage, env_steps: float, episodes: int) -> bool:
        """Whether spending (an estimate of) ``env_steps`` and ``episodes`` more stays within budget."""
        s = self.spec
        if s.env_steps is not None and usage.env_steps + env_steps > s.env_steps:
            return False
        return not (s.episodes is not None and usage.episodes + episodes > s.episodes)

    def stop_reason(self, usage: Usage, incumbent_validation_mean: float, stale_generations: int,
                    *, check_clock: bool = True) -> Stop | None:
        """Why the run must stop now (:class:`Stop`: a line of text with its kind), or None to go on."""
        s = self.spec
        if s.target is not None and incumbent_validation_mean >= s.target:
            return Stop(StopKind.TARGET,
                        f"target reached (incumbent validation mean {incumbent_validation_mean:.2f} ≥ {s.target:g})")
        if s.patience is not None and stale_generations >= s.patience:
            return Stop(StopKind.PATIENCE, f"patience: {stale_generations} generations without a promotion")
        if s.env_steps is not None and usage.env_steps >= s.env_steps:
            return Stop(StopKind.BUDGET, "env-step budget used")
        if s.episodes is not None and usage.episodes >= s.episodes:
            return Stop(StopKind.BUDGET, "episode budget used")
        if check_clock and s.wall_clock_s is not None and usage.wall_clock_s >= s.wall_clock_s:
            return Stop(StopKind.CLOCK, "wall-clock budget used")
        return None


@dataclass(frozen=True)
class Plan:
    """One generation's plan.

    Attributes:
        generation: 1-based generation number.
        train_seeds: Training seeds, shared by every candidate (common random numbers): fresh ones,
            plus ``weak_seeds`` drawn from the weakness pool.
        weak_seeds: The part of ``train_seeds`` drawn from the weakness pool.
    """

    generation: int
    train_seeds: tuple[int, ...]
    weak_seeds: tuple[int, ...] = ()


class WeaknessPool:
    """Training seeds on which the incumbent failed, weighted by how badly.

    After every generation the planner shows the pool the incumbent's training episodes: a seed
    enters (or stays) when the incumbent's return there falls short of the reference — the task's
    success threshold when it has one, else the incumbent's validation mean — with weight equal to
    the shortfall (return units); a seed the incumbent now handles leaves. Sampling is weighted,
    without replacement. The idea follows weakness-guided environment generation and
    autocurricula over hard instances (e.g. prioritized level replay, Jiang et al. 2021).

    Args:
        max_size: Most seeds kept (the worst ones stay).
    """

    def __init__(self, max_size: int = 200) -> None:
        self.max_size = max_size
        self.weights: dict[int, float] = {}

    def update(self, episodes: Sequence[Any], reference: float | None) -> None:
        """Add, reweight or drop seeds given the incumbent's episodes on them."""
        for ep in episodes:
            shortfall = (reference - ep.episode_return) if reference is not None else None
            failed = ep.error is not None or ep.success is False or (shortfall is not None and shortfall > 0)
            if failed:  # an errored episode counts at least as badly as a unit shortfall
                self.weights[ep.seed] = max(shortfall or 0.0, 1.0 if ep.error else 1e-3)
            else:
                self.weights.pop(ep.seed, None)
        if len(self.weights) > self.max_size:
            keep = sorted(self.weights.items(), key=lambda kv: -kv[1])[:self.max_size]
            self.weights = dict(keep)

    def sample(self, k: int, rng: np.random.Generator) -> list[int]:
        """Up to ``k`` distinct seeds, drawn with probability proportional to their weight."""
        if k <= 0 or not self.weights:
            return []
        seeds = sorted(self.weights)
        w = np.array([self.weights[s] for s in seeds], dtype=np.float64)
        k = min(k, len(seeds))
        idx = rng.choice(len(seeds), size=k, replace=False, p=w / w.sum())
        return [seeds[i] for i in sorted(idx)]

    def __len__(self) -> int:
        return len(self.weights)


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
        weakness_share: Share (0–1) of each generation's training seeds drawn from the weakness pool
            (seeds the incumbent failed on); 0 gives fresh seeds only.
        pool_size: Most seeds the weakness pool keeps.
    """

    def __init__(self, splits: SeedSplits, train_episodes: int, max_share: float, budget: Budget,
                 gate_choice: str = "best", weakness_share: float = 0.0, pool_size: int = 200) -> None:
        self.splits, self.train_episodes, self.max_share, self.budget = splits, train_episodes, max_share, budget
        self.gate_choice = gate_choice
        self.weakness_share = weakness_share
        self.pool = WeaknessPool(pool_size)
        #: What the env-step budget counts, for messages (the task's cost unit: ``"instances"``, ``"items"``).
        self.unit = "env steps"
        #: Whether every generation trains on the same seeds (a deterministic task, :attr:`ratchet.tasks.Task.
        #: deterministic`: a candidate proposed again is read back from the ledger, never scored twice).
        self.same_seeds = False

    def plan(self, generation: int) -> Plan:
        """Plan ``generation`` (1-based): ``train_episodes`` seeds, a ``weakness_share`` of them from the
        weakness pool (when it has any) and the rest fresh (with :attr:`same_seeds`, the first generation's). Deterministic given the run seed and the
        pool's history, so a resumed run plans the same seeds."""
        n_weak = round(self.weakness_share * self.train_episodes)
        rng = np.random.default_rng([self.splits.run_seed, generation, 7])
        weak = self.pool.sample(n_weak, rng)
        start = 0 if self.same_seeds else (generation - 1) * self.train_episodes
        fresh = self.splits.seeds("train", start, self.train_episodes - len(weak))
        return Plan(generation, tuple(fresh + weak), tuple(weak))

    def observe_incumbent(self, train: Evaluation, reference: float | None) -> None:
        """Feed the incumbent's training episodes of a generation to the weakness pool.

        Args:
            train: The incumbent's evaluation on the generation's training seeds.
            reference: The return an episode should reach (the loop passes the task's success
                threshold, or the incumbent's validation mean when the task has none); None uses the
                episodes' ``success`` flags and errors only.
        """
        self.pool.update(train.episodes, reference)

    def can_afford_generation(self, usage: Usage, n_candidates: int, est_episode_steps: float,
                              step_limit: float | None = None, reserve: tuple[float, int] = (0.0, 0)) -> bool:
        """Whether one more generation surely fits the budget, with ``reserve`` (env steps, episodes) still
        left after it: room for the gate of that generation, so its best candidate is never thrown away
        for want of a validation.

        With ``step_limit`` (the env's time limit, or the loop's price of an episode) that many steps per
        episode must fit; without one, the estimate plus a 25 % margin.
        """
        cost = self.generation_cost(n_candidates, est_episode_steps, step_limit)
        return self.budget.can_afford(usage, cost + reserve[0], n_candidates * self.train_episodes + reserve[1])

    def generation_cost(self, n_candidates: int, est_episode_steps: float, step_limit: float | None = None) -> float:
        """Env steps one generation may take: ``step_limit`` per episode when given (the time limit, or the
        loop's price for an episode, see :meth:`Pricing.episode_price`), else the estimate plus a
        25 % margin."""
        n_eps = n_candidates * self.train_episodes
        return n_eps * step_limit if step_limit else 1.25 * n_eps * est_episode_steps

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
        """True when :meth:`screen` lets the candidate through."""
        return IncumbentPlanner.screen(candidate_train, incumbent_train, incumbent_validation_mean) is None

    @staticmethod
    def screen(candidate_train: Evaluation, incumbent_train: Evaluation, incumbent_validation_mean: float) -> str | None:
        """Screen before spending validation episodes on a candidate.

        The candidate must do at least as well as the incumbent on this generation's training seeds
        (paired, same seeds; ties count because both may sit at the return ceiling, as in CartPole's
        500) and score above the incumbent's validation mean, the lower-noise estimate of the
        incumbent's expected return. The second condition matters once the incumbent is good: the
        best of a population on a few seeds beats it on those seeds by luck alone quite often, and
        each such gate costs a full validation (measured on lunar_lander, run seeds 0–2: test means
        281.4 / 288.4 / 273.8 with both conditions vs 273.2 / 283.5 / 273.8 with the paired one only).

        Returns:
            None when the candidate passes, else why not (one line, with the numbers).
        """
        diff = float(np.mean(candidate_train.returns - incumbent_train.returns))
        if diff < 0:
            return f"not better on training seeds (paired mean difference {diff:+.2f})"
        if not candidate_train.mean > incumbent_validation_mean:
            return (f"training mean {candidate_train.mean:.2f} not above the incumbent's validation mean "
                    f"{incumbent_validation_mean:.2f}")
        return None

    @staticmethod
    def cascade_drop(candidate_stage: Evaluation, incumbent_stage: Evaluation, margin: float) -> str | None:
        """Whether the cascade drops a contender after its first stage (``[planner] cascade_episodes``): it failed an
        episode there (it could never go to a gate), or its mean on the stage's seeds is below the incumbent's mean on
        the same seeds minus ``margin`` × the incumbent's standard deviation over them (population std, return units).

        The threshold is in units of that spread, not a share of the incumbent's mean: returns may be negative or
        near zero (bin packing's −excess %, a game's payoff), where a relative margin flips sign or vanishes, and a
        spread does not change when returns are shifted or scaled. Where the incumbent scores the same on every seed
        of the stage (std 0) a contender must at least match it.

        Returns:
            None when the contender goes on to the next stage, else why not (one line, with the numbers).
        """
        k = candidate_stage.n
        if candidate_stage.n_errors:
            return f"cascade: failed {candidate_stage.n_errors} of its first {k} training episodes"
        threshold = incumbent_stage.mean - margin * incumbent_stage.std
        if candidate_stage.mean >= threshold:
            return None
        return (f"cascade: mean {candidate_stage.mean:.4g} on its first {k} training episodes is below "
                f"{threshold:.4g} (the incumbent's {incumbent_stage.mean:.4g} on the same seeds − {margin:g} × its std "
                f"{incumbent_stage.std:.3g})")

    def should_gate(self, usage: Usage, n_validation: int, est_episode_steps: float,
                    next_generation_steps: float = 0.0, step_limit: int | None = None,
                    next_generation_episodes: int = 0) -> bool:
        """True when :meth:`validation_hold` has no objection."""
        return self.validation_hold(usage, n_validation, est_episode_steps, next_generation_steps, step_limit,
                                    next_generation_episodes) is None

    def validation_hold(self, usage: Usage, n_validation: int, est_episode_steps: float,
                        next_generation_steps: float = 0.0, step_limit: float | None = None,
                        next_generation_episodes: int = 0) -> str | None:
        """Whether to validate one candidate now.

        Yes when the budget surely affords it (worst case when ``step_limit`` is known) and either
        validation stays within ``max_share`` of all env steps, or this is the last chance: after
        it the budget could not pay for another generation (``next_generation_steps`` env steps and
        ``next_generation_episodes`` episodes; both matter, so the last chance also comes under an
        ``episodes`` budget).

        Returns:
            None to validate now, else why not (one line, with the numbers).
        """
        cost = n_validation * est_episode_steps
        worst = n_validation * step_limit if step_limit else 1.25 * cost
        if not self.budget.can_afford(usage, worst, n_validation):
            return (f"the budget cannot pay for validation ({n_validation} episodes, up to {worst:,.0f} {self.unit}); "
                    "a smaller [gate] validation_episodes or a larger budget would let it")
        if usage.validation_env_steps + cost <= self.max_share * (usage.env_steps + cost):
            return None
        after = Usage(usage.env_steps + int(cost), usage.episodes + n_validation, usage.validation_env_steps,
                      usage.wall_clock_s)
        if not self.budget.can_afford(after, next_generation_steps, next_generation_episodes):
            return None  # the last chance: after it no further generation would fit
        share = (usage.validation_env_steps + cost) / (usage.env_steps + cost)
        return (f"validation would take {100 * share:.0f} % of {self.unit}, over [gate] max_share = "
                f"{self.max_share:g}; it waits until search has spent more")


#: How the stop reason of a run whose budget could not buy one generation begins (the CLI exits 1: nothing was
#: refined, and the reason says which budget to raise).
_FIRST = "a single generation"
NO_GENERATION = f"budget: no room for {_FIRST}"


class Pricing:
    """What work costs against the run's budget before it runs, in env steps and episodes: one episode, a
    generation (its training evaluations and training jobs) and the gate it must leave room for.

    Args:
        budget: The ``[budget]`` settings (``env_steps``, ``episodes``).
        usage: The run's usage so far (read as it grows).
        planner: Prices a generation's training evaluations (:meth:`IncumbentPlanner.generation_cost`).
        step_limit: The task's time limit (env steps), or None.
        price_limit: The price of every episode under worst-case pricing (the time limit); None for observed
            pricing (the mean length seen plus a 25 % margin).
        validation_episodes: Validation episodes one gate is priced at (:meth:`ratchet.gate.Gate.price`).
        train_episodes: Training episodes per candidate per generation.
        reference: Whether the incumbent runs on every generation's training seeds whatever the refiner declares
            (:attr:`~ratchet.refiners.GenerationCost.reference`): the run's own decisions need it.
        confirmation_episodes: Training episodes a decision confirms its candidates on before validation
            (``[planner] decide = "powered"``, :mod:`ratchet.shortlist`), kept with the gate's reserve.
    """

    def __init__(self, budget: Any, usage: Usage, planner: IncumbentPlanner, step_limit: int | None,
                 price_limit: int | None, validation_episodes: int, train_episodes: int, reference: bool = True,
                 confirmation_episodes: int = 0) -> None:
        self.budget, self.usage, self.planner, self.reference = budget, usage, planner, reference
        self.confirmation_episodes = confirmation_episodes
        self.step_limit, self.price_limit = step_limit, price_limit
        self.validation_episodes, self.train_episodes = validation_episodes, train_episodes
        self._margin = 1.25  # observed pricing: the mean episode length seen, plus this margin

    def evaluations(self, cost: Any) -> int:
        """Candidates a generation of ``cost`` (:class:`~ratchet.refiners.GenerationCost`) evaluates on its training
        seeds: the incumbent among them when the refiner or the run needs it."""
        return int(cost.evaluations_with(self.reruns_incumbent(cost)))

    def reruns_incumbent(self, cost: Any) -> bool:
        """Whether a generation of ``cost`` runs the incumbent on its training seeds too."""
        return bool(self.reference or cost.reference)

    def fits(self, refiner: Refiner, est_len: float, reserve: tuple[float, int]) -> bool:
        """Whether ``refiner``'s next generation (its evaluations and training jobs, :meth:`Refiner.generation_cost`)
        and ``reserve`` (a kept gate, env steps and episodes) fit what is left of the budget."""
        cost = refiner.generation_cost()
        return self.planner.can_afford_generation(self.usage, self.evaluations(cost), est_len, self.episode_price(est_len),
                                                  (reserve[0] + cost.training_env_steps, reserve[1]))

    def gate_reserve(self, longest: float) -> tuple[float, int]:
        """(env steps, episodes) a generation must leave for its gate: one validation (and its confirmation), its
        episodes priced at ``longest``, the longest mean episode length seen so far (a candidate worth gating tends to
        play long) or, with ``decide = "powered"``, of the episodes a decision reads."""
        n = self.validation_episodes + self.confirmation_episodes
        return n * self.episode_price(longest), n

    def _levers(self) -> str:
        """The settings that size a generation and its kept decision, in words (the end of a no-room message)."""
        kept = "[gate] validation_episodes" + (", [planner] confirm_top / confirm_episodes" if self.confirmation_episodes
                                               else "")
        return f"the refiners' popsize / [planner] train_episodes / {kept}"

    def _kept(self) -> str:
        """What the reserve of :meth:`gate_reserve` pays for, in words."""
        if self.confirmation_episodes:
            return "a validation and a round of confirmation kept for the decision"
        return "a validation kept for its gate"

    def episode_price(self, est_len: float) -> float:
        """Env steps one episode is priced at: the time limit with worst-case pricing; with observed pricing
        the mean length seen (``est_len``, env steps) plus a 25 % margin, never above the time limit."""
        limit = self.step_limit
        if self.price_limit is not None:
            return float(self.price_limit)
        price = self._margin * est_len
        return float(min(price, limit)) if limit else float(price)

    def fit(self, refiner: Refiner, est_len: float, reserve: tuple[float, int]) -> bool:
        """Let a refiner whose generation no longer fits an env-step budget cut it to what is left after
        the generation's episodes and its gate (:meth:`Refiner.fit`, e.g. PPO's training job); True when it did."""
        limit = self.budget.env_steps
        if limit is None:
            return False
        n_candidates = self.evaluations(refiner.generation_cost())
        rest = (limit - self.usage.env_steps - reserve[0]
                - self.planner.generation_cost(n_candidates, est_len, self.episode_price(est_len)))
        return rest > 0 and bool(refiner.fit(int(rest)))

    def no_room_message(self, n_candidates: int, est_len: float, longest: float, first: bool, training: int = 0) -> Stop:
        """Why no further generation (``first``: not even one) fits the budget, in numbers, naming the
        budget that binds (``training``: env steps of the refiner's training jobs in a generation; ``longest``: the
        longest mean episode length seen, which prices the gate)."""
        what = _FIRST if first else "another generation"
        episodes = n_candidates * self.train_episodes
        b, u = self.budget, self.usage
        spent = "after " + ("validation" if first else "the generations so far")

        def of(key: str, used: int, total: int) -> str:
            if not u.episodes:  # priced before any episode ran (first_generation_unaffordable)
                return f"[budget] {key} = {total:,}, before the starting policy's validation"
            return f"{spent} used {used:,} of [budget] {key} = {total:,}"

        gate = self.gate_reserve(longest)[1]
        if b.episodes is not None and u.episodes + episodes + gate > b.episodes:
            return Stop(StopKind.BUDGET,
                        f"budget: no room for {what} ({episodes + gate} episodes: {n_candidates} candidates × "
                        f"{self.train_episodes} training episodes, and {gate} for its "
                        f"gate; {of('episodes', u.episodes, b.episodes)})"
                        + (f"; raise [budget] episodes or lower {self._levers()}" if first else ""))
        price = self.episode_price(est_len)
        cost = self.planner.generation_cost(n_candidates, est_len, price) + self.gate_reserve(longest)[0] + training
        unit = self.planner.unit
        per = (f"{price:,.0f} steps" + (" (the time limit)" if price == self.step_limit else "") if unit == "env steps"
               else f"{price:,.0f} {unit}" + (" (the most an instance costs)" if price == self.step_limit else ""))
        trained = f", {training:,} of the refiner's training" if training else ""
        return Stop(StopKind.BUDGET,
                    f"budget: no room for {what} (up to {cost:,.0f} {unit}: {n_candidates} candidates × "
                    f"{self.train_episodes} training episodes × {per}{trained}, and {self._kept()}; "
                    f"{of('env_steps', u.env_steps, b.env_steps)})"
                    + (f"; raise [budget] env_steps or lower {self._levers()}" if first else ""))

    def first_generation_unaffordable(self, refiners: Sequence[Refiner]) -> Stop | None:
        """Why no first generation can fit the budget whatever the starting policy's validation measures, asked
        before any episode runs: with every episode priced at the time limit (worst-case pricing), the cheapest
        working refiner's generation (its training evaluations, without training jobs a refiner may cut to fit) and
        the gate kept for it cost as much before validation as after it, and validation only adds to what is used.
        None where one may fit, where no refiner can work (the run says why), or where the price waits on the
        episode lengths validation measures (observed pricing)."""
        limit = self.price_limit
        working = [r for r in refiners if r.idle_reason() is None]
        if limit is None or not working:
            return None
        sizes = sorted(self.evaluations(r.generation_cost()) for r in working)
        if self.planner.can_afford_generation(self.usage, sizes[0], limit, self.episode_price(limit),
                                              self.gate_reserve(limit)):
            return None
        return self.no_room_message(sizes[0], limit, limit, first=True)

    def spare(self, n_candidates: int, est_len: float, reserve: tuple[float, int],
                     training: int) -> tuple[float, float]:
        """(env steps, episodes) of the budget left once this generation's episodes (as priced), its training
        jobs and a kept gate are paid for: what trace replays may spend (inf where there is no such budget)."""
        b, u = self.budget, self.usage
        steps = math.inf if b.env_steps is None else (
            b.env_steps - u.env_steps - reserve[0] - training
            - self.planner.generation_cost(n_candidates, est_len, self.episode_price(est_len)))
        episodes = math.inf if b.episodes is None else (
            b.episodes - u.episodes - reserve[1] - n_candidates * self.train_episodes)
        return max(0.0, steps), max(0.0, episodes)
