"""``[planner] overlap_gate``: the search does not wait for the gate. A generation's contender is validated in one
executor call with the next generation's training episodes, where nothing the verdict says can change that next
generation (:meth:`GateOverlap.allowed`).

"Run ahead, read back": after generation g's critique, the next generation's plan and proposals are made (its
refiner proposes without the verdict, :meth:`~ratchet.refiners.Refiner.proposes_without_verdict`) and one
:meth:`~ratchet.services.RunServices.run_ahead` call runs g's first validation batch beside g+1's training episodes,
each evaluation recorded under its own key and counted nowhere. The loop then goes on exactly as without overlap: g's
decision reads its first batch back (later batches of a sequential gate run as usual), g+1's propose takes the
proposals made ahead (:meth:`GateOverlap.take`) and its execute reads their evaluations back, so each is counted once,
when it is read; a run killed in between reads them back on resume. When g promotes candidate C, g+1's paired
reference must be C: execute runs C on g+1's training seeds then (a small extra call), and the old incumbent's run on
them, run ahead for nothing, is charged as re-evaluation. Work run ahead for a generation that never comes (the run
stopped first) is charged when the run finishes (:meth:`GateOverlap.drop`).

Budgets stay hard caps: the work run ahead is priced before it starts (the whole validation, every seed a sequential
gate may read and the incumbent's extension, the next generation, its kept gate and one more incumbent run), and the
executor's env-step cap leaves room for it until it is read back
(:attr:`~ratchet.services.RunServices.ahead`).

Determinism: whether a generation runs ahead depends only on what the ledger records (usage, patience, the contender,
the prices), never on timing (a wall-clock budget turns the overlap off), so the same spec and seed give the same
decisions with it, and a resumed run runs ahead where the first session did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ratchet.critic import Critique
from ratchet.deciders import Decider
from ratchet.planner import Budget, IncumbentPlanner, Pricing
from ratchet.policy import Candidate
from ratchet.refiners import Refiner
from ratchet.services import RunServices, eval_key
from ratchet.step import GenerationStep

__all__ = ["GateOverlap"]


class GateOverlap:
    """The run-ahead of one run (``[planner] overlap_gate``); off (every method a no-op) without the setting or where
    the run's settings rule it out.

    Args:
        services: The run's recorded services (evaluations, the gate's session, usage).
        refiners: The run's refiners by name.
        decider: The run's decider (:meth:`~ratchet.deciders.Decider.gated`).
        planner: Plans a generation's training seeds and prices its episodes.
        prices: What work costs against the budget.
        budget: The run's budget.
        ask: The loop's proposals for a planned generation, screened and not recorded
            (:meth:`ratchet.loop._Run.ask`): ``(step, critique) -> step``.
    """

    def __init__(self, services: RunServices, refiners: Mapping[str, Refiner], decider: Decider,
                 planner: IncumbentPlanner, prices: Pricing, budget: Budget,
                 ask: Callable[[GenerationStep, Critique | None], GenerationStep]) -> None:
        self.services, self.refiners, self.decider, self.ask = services, refiners, decider, ask
        self.planner, self.prices, self.budget = planner, prices, budget
        spec = services.spec
        b = spec.budget
        self.on = (spec.planner.overlap_gate and len(refiners) == 1 and not services.task.changes_on_promotion
                   and spec.planner.cascade_episodes == 0 and not spec.model.screen
                   and b.target is None and b.wall_clock_s is None)
        self._held: GenerationStep | None = None

    def allowed(self, step: GenerationStep, stale: int) -> bool:
        """Whether generation ``step`` (critiqued, not decided; ``stale`` generations without progress before it) may
        run its first validation batch beside the next generation: the setting and the run allow it, its refiner
        proposes without the verdict and is not idle, its decider knows the contender it validates
        (:meth:`~ratchet.deciders.Decider.gated`), patience cannot end the run after it, and the budget pays for the
        whole validation, the next generation, its kept gate and one more incumbent run (at the prices the plan
        uses)."""
        run = self.services
        refiner = self.refiners[step.refiner]
        patience = run.spec.budget.patience
        if not (self.on and not step.broken and refiner.proposes_without_verdict() and refiner.idle_reason() is None
                and (patience is None or stale + 1 < patience)):
            return False
        best = self.decider.gated(step)
        if best is None:
            return False
        prices, inc_val = self.prices, step.incumbent_validation
        n = len(run.validation_seeds)
        lengths = [step.longest, step.est_len, inc_val.env_steps / max(1, inc_val.n)]
        lengths += [e.env_steps / e.n for e in [step.train.get(best.id)] if e is not None and e.n]
        validation = n + max(0, n - inc_val.n)  # the candidate on every seed, the incumbent extended to them
        cost = refiner.generation_cost()
        n_next = prices.evaluations(cost)
        reserve = prices.gate_reserve(step.longest)
        train = run.spec.planner.train_episodes
        price = prices.episode_price(step.est_len)
        steps = (validation * prices.episode_price(max(lengths)) + reserve[0] + cost.training_env_steps
                 + self.planner.generation_cost(n_next, step.est_len, price) + train * price)
        episodes = validation + reserve[1] + (n_next + 1) * train
        return self.budget.can_afford(run.usage, steps, episodes)

    def ahead(self, step: GenerationStep, stale: int, critique: Critique | None) -> None:
        """When :meth:`allowed`: make the next generation's plan and proposals (recorded when its turn comes) and run
        this generation's first validation batch beside the next one's training episodes in one executor call.
        ``stale``: generations without progress before this one; ``critique``: the incumbent's latest training critique
        before this one (the next generation is handed this one's when the incumbent ran, as without a promotion)."""
        if not self.allowed(step, stale):
            return
        run = self.services
        best, incumbent, inc_val = self.decider.gated(step), step.incumbent, step.incumbent_validation
        assert best is not None  # allowed() checked it
        cost = self.refiners[step.refiner].generation_cost()
        generation = step.generation + 1
        planned = GenerationStep(generation, step.refiner, cost, self.prices.gate_reserve(step.longest),
                                 self.planner.plan(generation), incumbent, inc_val, step.est_len,
                                 rerun=self.prices.reruns_incumbent(cost), longest=step.longest)
        self._held = nxt = self.ask(planned, step.critique if step.incumbent_train is not None else critique)
        hi = run.gate_session(best, incumbent).next_batch_size()
        seeds = run.validation_seeds
        groups: list[tuple[list[Candidate], Sequence[int], str, int]] = (
            [([incumbent], seeds[inc_val.n:hi], "validation", step.generation)] if inc_val.n < hi else [])
        groups += [([best], seeds[:hi], "validation", step.generation),
                   ([*nxt.contenders, *[incumbent] * nxt.rerun], nxt.plan.train_seeds, "train", generation)]
        run.run_ahead(groups)

    def take(self, step: GenerationStep) -> GenerationStep | None:
        """The proposals made ahead for ``step`` (planned now, after the verdict), with ``step``'s incumbent, or None
        (none were made, or the plan changed). When the verdict moved the incumbent, the old incumbent's run on the
        step's training seeds is read back and charged as re-evaluation: execute runs the new one's."""
        held, self._held = self._held, None
        if held is None:
            return None
        if (held.generation, held.refiner, held.cost, held.plan) != (step.generation, step.refiner, step.cost, step.plan):
            self._charge(held)
            return None
        if held.rerun and held.incumbent.id != step.incumbent.id:
            self._charge(replace(held, contenders=()))
        return replace(step, contenders=held.contenders, recommended=held.recommended, rerun=held.rerun,
                       refused=held.refused, failures=held.failures, stopped=held.stopped)

    def drop(self) -> None:
        """Charge what was run ahead for a generation that never came (the run stops): read back as re-evaluation."""
        held, self._held = self._held, None
        if held is not None:
            self._charge(held)

    def _charge(self, held: GenerationStep) -> None:
        """Read back (and so count) the training evaluations run ahead for ``held`` that the run will not use, as
        re-evaluation env steps; those the executor did not finish are not run."""
        run, seeds = self.services, held.plan.train_seeds
        ran = [c for c in dict.fromkeys([*held.contenders, *[held.incumbent] * held.rerun])
               if eval_key("train", c.id, seeds) in run.ahead]
        if ran:
            spent = run.evaluate(ran, seeds, "train", held.generation)
            run.usage.reeval_env_steps += sum(e.env_steps for e in spent.values())
