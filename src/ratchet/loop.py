"""The run loop: plan → propose → execute → critique → decide → record, every step recorded in the ledger.

:meth:`_Run.run` drives it a generation at a time, handing one typed record of the generation
(:class:`~ratchet.step.GenerationStep`) from phase to phase; the decisions are a :class:`~ratchet.deciders.Decider`'s
(``[planner] decide``), the work is the recorded services' (:mod:`ratchet.services`).

Resuming is replay: :func:`resume_run` runs the same deterministic loop again over the same ledger.
Every evaluation already recorded is read back instead of executed, and every event already
recorded is not appended twice (events are keyed), so a run killed at any point — even with
``kill -9`` — continues exactly where it stopped without recomputing or losing a completed
evaluation.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import platform
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from ratchet.critic import Critique, Evaluation
from ratchet.deciders import DECIDERS, Outcome, build_decider
from ratchet.errors import EndpointError, FixedOutsideError, LedgerError, RatchetError, SpecError, WriterLeaseError
from ratchet.execution import Executor, executor_from_spec
from ratchet.ledger import EventType, LedgerStore
from ratchet.ledger.lease import WriterLease
from ratchet.ledger.projection import active_seconds
from ratchet.ledger.rounds import unfinished_round
from ratchet.ledger.storage import LEDGER_FILE, POINTER_FILE, is_run_id, open_store, storage_url, write_pointer
from ratchet.metrics import check_logging, metrics_tap
from ratchet.overlap import GateOverlap
from ratchet.planner import Budget, IncumbentPlanner, Pricing, SeedSplits, Stop, StopKind
from ratchet.policies import read_program
from ratchet.policy import (
    FOLDER_KINDS,
    SOURCE_KINDS,
    SPACE_KINDS,
    Candidate,
    PolicyProgram,
    load_policy,
    uses_task_dims,
)
from ratchet.refiners import GenerationCost, Refiner, ThompsonAllocator
from ratchet.refiners.base import Turn
from ratchet.refiners.registry import Purse, RefinerContext, arm_names, refiner_kind
from ratchet.refiners.screened import screen_refiners
from ratchet.runs import lock_run_dir, new_run_id, open_for_writing, open_ledger, open_run, started_event
from ratchet.services import RunServices, _cut, eval_key
from ratchet.spec import RunSpec, screen_unused_reasons, spec_from_dict
from ratchet.step import GenerationStep
from ratchet.tasks import Task, task_from_dict, task_from_spec

__all__ = ["LEDGER_FILE", "RunResult", "eval_key", "open_ledger", "open_run", "resume_run", "start_run"]

ProgressFn = Callable[[dict[str, Any]], None]


#: How the stop reason of a run whose starting policy failed every validation episode begins (the CLI exits 1).
BROKEN_START = "the starting policy failed all"


@dataclass(frozen=True)
class RunResult:
    """What a finished run returns.

    Attributes:
        run_dir: The run's directory (holds ``policy.py``, the report, and ``ledger.sqlite`` or, with a
            storage URL, the ``ledger.json`` pointer to the database).
        stop_reason: Why the loop stopped.
        incumbent: The final incumbent candidate.
        baseline_test: Test evaluation of the starting policy; None where a budget could not buy a single
            generation (nothing was searched, so no test episodes were spent).
        test: Test evaluation of the final incumbent; None where ``baseline_test`` is.
    """

    run_dir: Path
    stop_reason: str
    incumbent: Candidate
    baseline_test: Evaluation | None
    test: Evaluation | None


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("policy-ratchet", "gymnasium", "numpy", "cma", "scipy", "box2d"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


@dataclass(frozen=True)
class SearchState:
    """Where the search stands between generations.

    Attributes:
        incumbent: The incumbent.
        validation: The incumbent's validation evaluation.
        critique: The incumbent's latest training critique (handed to the refiner), or None.
        est_len: The episode length (env steps) the next generation is priced at: the last one's mean.
        longest: The longest mean episode length (env steps) a decision reads: what a gate is priced from.
        stale: Generations since the last progress (a promotion, or what the decider counts: patience).
        completed: Generations finished (recorded).
    """

    incumbent: Candidate
    validation: Evaluation
    critique: Critique | None
    est_len: float
    longest: float
    stale: int = 0
    completed: int = 0


class _Run(RunServices):
    """One run's loop over its recorded services (:class:`~ratchet.services.RunServices`): :meth:`run` reads
    plan → propose → execute → critique → decide → record, and prices work with :class:`~ratchet.planner.Pricing`;
    the decisions are its :class:`~ratchet.deciders.Decider`'s. It holds no policy logic of its own."""

    def __init__(self, run_dir: Path, spec: RunSpec, program: PolicyProgram, ledger: LedgerStore,
                 executor: Executor, progress: ProgressFn | None, pricing: str | None = None,
                 start: Candidate | None = None, inputs: dict[str, str] | None = None, task: Task | None = None) -> None:
        super().__init__(run_dir, spec, program, ledger, executor, pricing, start, inputs, task)
        self.progress = progress
        self.budget = Budget(spec.budget)
        self.planner = IncumbentPlanner(self.splits, spec.planner.train_episodes, spec.gate.max_share, self.budget,
                                        spec.planner.gate_candidate, spec.planner.weakness_share,
                                        spec.planner.pool_size)
        self.planner.unit = self.task.cost_unit
        self.planner.same_seeds = self.task.deterministic  # a candidate proposed again is read back, not rerun
        self._trained: set[str] = set()  # candidates with a training evaluation (a new one is search, not re-evaluation)
        confirmation = spec.planner.confirmation_reserve(spec.gate.validation_episodes)
        paired = DECIDERS[spec.planner.decide].pairs_with_incumbent
        self.prices = Pricing(spec.budget, self.usage, self.planner, self.task.step_limit, self.price_limit,
                              self.validation_price(), spec.planner.train_episodes,
                              reference=paired or spec.planner.weakness_share > 0  # a cascade's threshold: the incumbent
                              or spec.planner.cascade_episodes > 0,
                              confirmation_episodes=confirmation)
        self.decider = build_decider(self, self.planner, self.prices, self.budget)
        self.refiners = self._build_refiners()
        names = list(self.refiners)
        self.allocator = ThompsonAllocator(names, spec.seed) if len(names) > 1 else None
        self._retired: set[str] = set()  # refiners whose stop the progress said (:meth:`newly_retired`)
        self.overlap = GateOverlap(self, self.refiners, self.decider, self.planner, self.prices, self.budget, self.ask)

    def _build_refiners(self) -> dict[str, Any]:
        """One refiner (or several: variants) per ``[[refiners]]`` table, from the kinds' registry."""
        entries = self.spec.refiner_entries()
        out: dict[str, Any] = {}
        b = self.spec.budget
        money = None if b.money is None else Purse(b.money, b.currency)  # shared by every refiner that pays
        for i, (entry, name) in enumerate(zip(entries, arm_names(entries))):
            kind = refiner_kind(entry["kind"])
            settings = kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")})
            ctx = RefinerContext(program=self.program, start=self.start, task=self.task, seed=self.spec.seed + 1000 * i,
                                 name=name, train=self.train, artifact=self.artifact,
                                 training_seeds=self.training_seeds, exchange=self.exchange,
                                 exchange_all=self.exchange_all, exchange_ahead=self.exchange_ahead,
                                 read_input=self.read_input, critique=self.critique_of, time_left=self.time_left,
                                 money=money, transitions=self.transitions)
            for ref in screen_refiners(kind.build(settings, name, ctx), self.spec.model, ctx,  # [model] screen
                                       screen_unused_reasons(self.spec) if self.spec.model.screen else ()):
                out[ref.name] = ref
        return out

    def run(self) -> RunResult:
        """The search, one generation at a time — plan, propose, execute, critique, decide, record — until a budget or
        a stop rule ends it; then the decider's final decision and the report-only test evaluation."""
        now, stop = self.begin()
        while stop is None:
            planned = self.plan(now)
            if isinstance(planned, Stop):  # a budget, a stop rule, no room left, an idle refiner
                return self.finish(now, planned)
            step = self.execute(self.propose(planned, now))
            if step.cut:  # the executor's hard cap stopped it: judge nothing from it
                return self.finish(now, Stop(StopKind.BUDGET, "env-step budget used (the last generation was cut "
                                                              "short by the cap; it was not judged)"))
            step = self.critique(step)
            self.overlap.ahead(step, now.stale, now.critique)  # [planner] overlap_gate: the next generation beside the gate
            outcome = self.decider.decide(step)
            now, stop = self.record_generation(step, outcome, now)
        return self.finish(now, stop)

    def begin(self) -> tuple[SearchState, Stop | None]:
        """Record the starting candidate, let the task take it in (a game's self-play league starts with it) and
        validate it (on the first look of a sequential gate, which extends it as decisions read); with why the run
        must not search at all (:meth:`broken_start`)."""
        baseline = self.start
        self.record_candidate(baseline, 0)
        self.task_after_incumbent(baseline)
        n_first = self.gate.first_look(len(self.validation_seeds))
        inc_val = self.evaluate([baseline], self.validation_seeds[:n_first], "validation", 0)[baseline.id]
        self.decider.start(inc_val)
        est_len = max(1.0, inc_val.env_steps / max(1, inc_val.n))
        return SearchState(baseline, inc_val, None, est_len, longest=est_len), self.broken_start(inc_val)

    def plan(self, now: SearchState) -> GenerationStep | Stop:
        """The next generation's plan: which refiner takes it, what it costs, whether it fits, its training seeds
        (:class:`~ratchet.planner.Plan`) and what trace replays may spend; or why the search stops here instead (a
        budget, a stop rule, no room left, or an idle refiner)."""
        generation = now.completed + 1
        replaying = self.begin_generation(generation)
        stop = self.budget.stop_reason(self.usage, now.validation.mean, now.stale, check_clock=not replaying)
        arm, cost, reserve, stop = self.choose_and_price(generation, now.est_len, now.longest, stop)
        if stop is not None:
            return stop
        n_candidates = self.prices.evaluations(cost)
        rerun = self.prices.reruns_incumbent(cost)  # the incumbent on the same seeds: a paired reference
        plan = self.planner.plan(generation)
        self.reserve_for_traces(self.prices.spare(n_candidates, now.est_len, reserve, cost.training_env_steps))
        return GenerationStep(generation, arm, cost, reserve, plan, now.incumbent, now.validation, now.est_len,
                              rerun=rerun, longest=now.longest)

    def propose(self, step: GenerationStep, now: SearchState) -> GenerationStep:
        """The refiner's proposals from the incumbent and its latest critique, screened before any episode runs
        (what fails is recorded as ``proposal_rejected``), and its recommendation (for the program the incumbent
        runs); the contenders are recorded. A refiner whose outside service is down stops, and the run goes on
        without it while another refiner can (else :class:`~ratchet.errors.EndpointError` stops the run,
        resumable)."""
        step = self.overlap.take(step) or self.ask(step, now.critique)
        self.record_candidates(step.contenders, step.generation)
        for r in self.refiners.values():  # work for later generations starts now (an llm's requests sent ahead)
            r.prepare(step.incumbent, now.critique, self.rng)
        return step

    def ask(self, step: GenerationStep, critique: Critique | None) -> GenerationStep:
        """:meth:`propose` without recording the contenders: the refiner's screened proposals and recommendation from
        ``step``'s incumbent and ``critique`` (also asked ahead of the verdict, :mod:`ratchet.overlap`)."""
        refiner, incumbent = self.refiners[step.refiner], step.incumbent
        recommended = refiner.recommend()
        if recommended is not None and recommended.source != incumbent.source:
            recommended = None  # for a program the incumbent no longer runs (a structural promotion since)
        self.begin_requests()  # the generation's failed requests to outside services
        stopped = None
        try:
            proposed = refiner.propose(incumbent, critique, self.rng)
        except EndpointError as exc:  # its service is down: go on without it, or stop (resumable)
            if not self.others_available(step.refiner, step.est_len, step.reserve):
                raise
            proposed, stopped = list(exc.proposals), str(exc)
        screened = refiner.take_rejections()
        proposals, refused = self.screen_proposals(step.refiner, incumbent, proposed, step.generation, screened)
        refiner.refused(refused)  # so an LLM sees "you proposed this already"
        contenders = proposals + ([recommended] if recommended is not None else [])
        why = refiner.idle_reason() if not proposed and not screened else None  # it tried and proposed nothing
        idle = why and (f"no request of {step.refiner} was affordable ({why})" if refiner.budget_spent()
                        else f"{step.refiner} proposed nothing ({why})")
        return replace(step, contenders=tuple(contenders), recommended=recommended,
                       rerun=step.rerun and bool(contenders),  # no contender: nothing to compare the incumbent with
                       refused=len(screened) + len(proposed) - len(proposals), failures=self.failed_requests(),
                       stopped=stopped, idle=idle)

    def execute(self, step: GenerationStep) -> GenerationStep:
        """The contenders' (and the paired incumbent's) training episodes, recorded; a candidate evaluated before
        counts as re-evaluation. With ``[planner] cascade_episodes`` they run in two stages
        (:meth:`~ratchet.services.RunServices.evaluate_cascade`): the contenders dropped after the first leave
        ``contenders`` (and ``recommended``) for ``dropped``, with their first-stage evaluations."""
        if self.spec.planner.cascade_episodes and step.rerun:
            train, dropped = self.evaluate_cascade(step.refiner, step.contenders, step.incumbent,
                                                   step.plan.train_seeds, step.generation)
        else:
            train, dropped = self.evaluate(list(step.contenders) + [step.incumbent] * step.rerun,
                                           step.plan.train_seeds, "train", step.generation), {}
        ran = {**{cid: ev for cid, (_, ev) in dropped.items()}, **train}
        self.usage.reeval_env_steps += sum(e.env_steps for c, e in ran.items() if c in self._trained)
        self._trained.update(ran)
        recommended = step.recommended if step.recommended is None or step.recommended.id not in dropped else None
        return replace(step, train=train, cut=any(_cut(e) for e in train.values()), dropped=dropped,
                       contenders=tuple(c for c in step.contenders if c.id not in dropped), recommended=recommended)

    def critique(self, step: GenerationStep) -> GenerationStep:
        """What the generation's episodes say: the refiner observes them (its recommendation after the proposals,
        the incumbent's paired reference last), the decider takes them in (:meth:`~ratchet.deciders.Decider.
        observe`), the incumbent's training critique, the generation's best contender, and what the next generation
        and its kept gate will cost."""
        train, incumbent = step.train, step.incumbent
        evaluations = list(train.values())
        refiner = self.refiners[step.refiner]
        refiner.dropped({cid: why for cid, (why, _) in step.dropped.items()})
        refiner.observe([train[c.id] for c in step.contenders] + [ev for _, ev in step.dropped.values()]
                        + ([train[incumbent.id]] if step.rerun else []))
        self.see_training_returns(evaluations)
        est_len = step.est_len
        if evaluations:  # else the last generation's lengths still price the next
            est_len = max(1.0, sum(e.env_steps for e in evaluations) / max(1, sum(e.n for e in evaluations)))
        step = replace(step, est_len=est_len, broken=bool(evaluations) and not any(e.env_steps for e in evaluations))
        longest = self.decider.observe(step, step.longest)
        inc_train, critique = train.get(incumbent.id), None
        if inc_train is not None:
            critique = self.critic.critique(inc_train)
            threshold = self.task.success_threshold
            self.planner.observe_incumbent(inc_train, step.incumbent_validation.mean if threshold is None else threshold)
        best = self.planner.gate_candidate(list(step.contenders), step.recommended, train, incumbent)
        n_candidates, reserve = self.prices.evaluations(step.cost), self.prices.gate_reserve(longest)
        searched = self.planner.generation_cost(n_candidates, est_len, self.prices.episode_price(est_len))
        next_cost = (searched + reserve[0] + step.cost.training_env_steps,
                     n_candidates * self.spec.planner.train_episodes + reserve[1])
        return replace(step, longest=longest, incumbent_train=inc_train, critique=critique, best=best,
                       next_cost=next_cost)

    def record_generation(self, step: GenerationStep, outcome: Outcome, now: SearchState
                          ) -> tuple[SearchState, Stop | None]:
        """Tell the refiner (and the allocator) the outcome, move the incumbent on a promotion, record the
        ``generation_finished`` summary and report progress. Returns where the search stands now, and why it stops
        after this generation (every episode failed before its first env step), or None."""
        refiner, promoted = self.refiners[step.refiner], outcome.promoted
        refiner.verdict(outcome.candidate.id if outcome.candidate is not None else None, promoted, outcome.note)
        incumbent, inc_val = step.incumbent, outcome.incumbent_validation
        if promoted and outcome.candidate is not None and outcome.candidate_validation is not None:
            incumbent, inc_val = outcome.candidate, outcome.candidate_validation
        if self.allocator is not None:
            self.allocator.record(step.refiner, outcome.gain)
        summary = self.summary(step, outcome, incumbent, inc_val)
        self.record(EventType.GENERATION_FINISHED, f"generation/{step.generation}", summary)
        critique = step.critique if step.incumbent_train is not None else now.critique
        if promoted and incumbent.id in step.train:  # the next generation edits the new incumbent: its own critique
            critique = self.critic.critique(step.train[incumbent.id])
        self.report_progress(**summary, wall_clock_s=self.usage.wall_clock_s, n_refiners=len(self.refiners),
                             replayed=self._replaying,  # a resumed run read this generation back from the ledger
                             **self.newly_retired(step))
        stale = 0 if promoted or self.decider.progressed(step.generation) else now.stale + 1
        stop = (Stop(StopKind.BROKEN, "every episode of the generation failed before its first env step; see why with "
                     f"`ratchet evaluate --run {self.run_dir}`") if step.broken else None)
        return SearchState(incumbent, inc_val, critique, step.est_len, step.longest, stale, step.generation), stop

    def newly_retired(self, step: GenerationStep) -> dict[str, Any]:
        """The refiners that stopped taking generations since the last progress report while another goes on, for
        the progress line: ``{"retired": {arm: why}, "going_on": [arm, ...]}`` (why: its
        :meth:`~ratchet.refiners.Refiner.idle_reason`, or the endpoint failure that stopped it), or ``{}``."""
        if len(self.refiners) < 2:
            return {}
        idle = {a: r.idle_reason() for a, r in self.refiners.items()}
        if step.stopped and idle.get(step.refiner) is None:
            idle[step.refiner] = step.stopped
        retired = {a: str(why) for a, why in idle.items() if why is not None and a not in self._retired}
        going_on = [a for a, why in idle.items() if why is None]
        self._retired.update(retired)
        return {"retired": retired, "going_on": going_on} if retired and going_on else {}

    def summary(self, step: GenerationStep, outcome: Outcome, incumbent: Candidate, inc_val: Evaluation
                ) -> dict[str, Any]:
        """The ``generation_finished`` payload: the generation's plan, its best contender, the decision, the refiner's
        own summary, the usage so far and the incumbent's critique."""
        train, gated = step.train, outcome.decision is not None
        return {"generation": step.generation, "train_seeds": list(step.plan.train_seeds),
                "weak_seeds": list(step.plan.weak_seeds), "weakness_pool": len(self.planner.pool),
                "best_train_mean": train[step.best.id].mean if step.best else None,
                **({"gated_id": outcome.candidate.id} if gated and outcome.candidate is not None else {}),
                "incumbent_train_mean": step.incumbent_train.mean if step.incumbent_train is not None else None,
                "incumbent_id": incumbent.id,
                "incumbent_validation_mean": inc_val.mean, "gated": gated,
                "gate_note": outcome.note,
                "promoted": outcome.promoted, "refiner": step.refiner, "population": step.cost.proposals,
                "cost": dataclasses.asdict(step.cost),
                **self.refiners[step.refiner].summary(),
                "env_steps": self.usage.env_steps, "episodes": self.usage.episodes,
                "validation_env_steps": self.usage.validation_env_steps,
                "critique": step.critique.to_dict() if step.critique is not None else None,
                "endpoint_failures": len(step.failures),
                "failed_episodes": sum(ev.n_errors for ev in train.values()),  # raised, timed out, failed to load
                **({"refiner_stopped": step.stopped} if step.stopped else {})}

    def finish(self, now: SearchState, stop: Stop) -> RunResult:
        """The decider's final decision where the way the search stopped calls for it
        (:meth:`~ratchet.deciders.Decider.concludes`), the report-only test evaluation of the incumbent and the
        starting policy (never used for selection), and ``run_finished``. A budget that could not buy a single
        generation searched nothing: no test episodes are spent on it (``test`` and ``baseline_test`` None)."""
        incumbent, inc_val, baseline = now.incumbent, now.validation, self.start
        self.overlap.drop()  # work run ahead for a generation that never came is charged
        if self.decider.concludes(stop):
            incumbent, inc_val = self.decider.conclude(now.completed, incumbent, inc_val)
        test: dict[str, Evaluation] = {}
        if now.completed > 0 or stop.kind is not StopKind.BUDGET:
            test = self.evaluate([incumbent, baseline], self.test_seeds, "test", now.completed)
        inc_test, base_test = test.get(incumbent.id), test.get(baseline.id)
        critiques = ({} if inc_test is None or base_test is None else
                     {"test": inc_test.summary(), "baseline_test": base_test.summary(),
                      "test_critique": self.critic.critique(inc_test, base_test).to_dict(),
                      "baseline_test_critique": self.critic.critique(base_test).to_dict()})
        settled = {name: facts for name, r in self.refiners.items() if (facts := r.finish())}
        self.tick_clock()
        self.record(EventType.RUN_FINISHED, "run_finished",
                    {"stop_reason": str(stop), "stop_kind": stop.kind.value, "generations": now.completed,
                     "incumbent_id": incumbent.id,
                     "baseline_id": baseline.id, "incumbent_validation_mean": inc_val.mean,
                     "test": None, "baseline_test": None, **critiques,
                     "env_steps": self.usage.env_steps, "episodes": self.usage.episodes,
                     "wall_clock_s": self.usage.wall_clock_s,
                     "env_steps_breakdown": self.usage.breakdown(self.spec.budget.env_steps),
                     **({"refiners_at_end": settled} if settled else {})})
        return RunResult(self.run_dir, str(stop), incumbent, base_test, inc_test)

    def choose_and_price(self, generation: int, est_len: float, longest: float, stop: Stop | None
                         ) -> tuple[str, GenerationCost, tuple[float, int], Stop | None]:
        """Which refiner takes this generation (:meth:`choose_refiner`), what its generation costs (cut to the
        budget's rest where it can be, :meth:`~ratchet.planner.Pricing.fit`) and the gate it must leave room for
        (priced from ``longest``, env steps); with why the run stops here instead (``stop`` already set, no room
        left, or the refiner is idle).

        Returns:
            ``(arm, cost, reserve, stop)``: ``reserve`` is (env steps, episodes) kept for the gate.
        """
        reserve = self.prices.gate_reserve(longest)

        def fits(r: Refiner) -> bool:  # the refiner's generation, its training jobs and a kept gate
            return self.prices.fits(r, est_len, reserve)

        arm = self.choose_refiner(generation, fits) if stop is None else next(iter(self.refiners))
        refiner = self.refiners[arm]
        if stop is None and not fits(refiner):
            self.prices.fit(refiner, est_len, reserve)  # e.g. PPO cuts its job to the budget's rest
        cost = refiner.generation_cost()
        stop = stop or (self.retired() if refiner.idle_reason() is not None else None)
        if stop is None and not fits(refiner):  # on the first generation, nothing would happen at all: say so
            stop = self.prices.no_room_message(self.prices.evaluations(cost), est_len, longest, first=generation == 1,
                                               training=cost.training_env_steps)
        return arm, cost, reserve, stop

    def retired(self) -> Stop:
        """Why no refiner takes another generation once every one is idle: their reasons, one line; a budget stop
        (:attr:`~ratchet.planner.StopKind.BUDGET`, the final decision follows) when each retired on its own budget
        (:meth:`~ratchet.refiners.Refiner.budget_spent`), else an idle one."""
        reasons = list(dict.fromkeys(str(r.idle_reason()) for r in self.refiners.values()))
        spent = all(r.budget_spent() for r in self.refiners.values())
        return Stop(StopKind.BUDGET if spent else StopKind.IDLE, "; ".join(reasons))

    def others_available(self, arm: str, est_len: float, reserve: tuple[float, int]) -> bool:
        """Whether a refiner other than ``arm`` may still take generations (not idle, and its generation and
        ``reserve`` fit the budget, episodes priced from ``est_len`` env steps)."""
        return any(a != arm and r.idle_reason() is None and self.prices.fits(r, est_len, reserve)
                   for a, r in self.refiners.items())

    def choose_refiner(self, generation: int, fits: Callable[[Any], bool] = lambda r: True) -> str:
        """Which refiner configuration gets this generation (Thompson sampling when there are several);
        the choice and its reasons are recorded in the ledger. A refiner that is idle, or whose generation
        no longer ``fits`` the budget (a training job priced above what is left), sits out while another
        can go on, so a cheap refiner may spend what an expensive one leaves; a refiner's prepared work that is due
        claims the generation, and one still coming keeps it out (:meth:`~ratchet.refiners.Refiner.turn`)."""
        if self.allocator is None:
            return next(iter(self.refiners))
        available = [a for a, r in self.refiners.items()
                     if r.idle_reason() is None and fits(r)]
        if not available:  # a refiner that can go on, so the stop says what ended the run (no room), not an idle one
            return next((a for a, r in self.refiners.items() if r.idle_reason() is None), next(iter(self.refiners)))
        turns = self.turns(generation, available)
        arm, why = self.allocator.choose(generation, available, turns)
        told = {a: t.value for a, t in turns.items() if t is not Turn.FREE}
        self.record(EventType.GENERATION_PLANNED, f"plan/{generation}",
                    {"generation": generation, **why, **({"turns": told} if told else {})})
        return arm

    def turns(self, generation: int, available: Sequence[str]) -> dict[str, Turn]:
        """Each available refiner's :meth:`~ratchet.refiners.Refiner.turn` for ``generation`` (prepared work due, or
        still coming), with those not :attr:`~Turn.FREE` recorded under ``turns`` in its ``generation_planned`` event
        (an ``llm``'s ``lag = "auto"``: whether a wave's answers are in is timing's); a generation the ledger already
        planned reads them back instead of asking (a resumed run takes the same waves at the same generations)."""
        planned = self.ledger.get(f"plan/{generation}")
        if planned is not None and "turns" in planned.payload:
            told = planned.payload["turns"]
            return {a: Turn(told.get(a, Turn.FREE.value)) for a in available}
        return {a: self.refiners[a].turn(generation) for a in available}

    def report_progress(self, **info: Any) -> None:
        if self.progress is not None:
            self.progress({"usage": self.usage, "budget": self.spec.budget, "cost_unit": self.task.cost_unit,
                           "episode_unit": self.task.episode_unit, **info})

    def broken_start(self, inc_val: Evaluation) -> Stop | None:
        """Why the run must not search at all: every validation episode of the starting policy ended in an
        error (a model for another env, an unsupported algorithm, an act() that raises), quoting the first."""
        if not inc_val.n or inc_val.n_errors < inc_val.n:
            return None
        first = next(e.error for e in inc_val.episodes if e.error is not None).strip().splitlines()[-1][:300]
        return Stop(StopKind.BROKEN, f"{BROKEN_START} {inc_val.n} of its validation episodes, so nothing was "
                    f"searched: {first}; see the episodes with `ratchet evaluate --run {self.run_dir}`")


def _drive(run: _Run, close_executor: bool, lock_fd: int, lease: WriterLease, resume: str) -> RunResult:
    """Run ``run`` to its end, then close what it holds. Something outside ratchet that stopped it
    (:class:`~ratchet.errors.FixedOutsideError`) is told ``resume``, the command that continues the run (e.g.
    ``ratchet resume runs/ID``), which its message ends with."""
    # [logging]: the run's progress function, chained behind a tap that writes the ledger's new generation events
    # as scalars (ratchet.metrics); the loop itself knows no writer
    metrics = None
    try:
        metrics = metrics_tap(run.spec.logging.tensorboard, started_event(run.ledger).payload["run_id"], run.ledger,
                              run.progress)
        if metrics is not None:
            run.progress = metrics
        return run.run()
    except (KeyboardInterrupt, WriterLeaseError):  # a lost lease: another process writes the run now
        raise
    except Exception as exc:
        if not lease.lost:
            run.record(EventType.RUN_FAILED, f"run_failed/{time.time()}", {"error": f"{type(exc).__name__}: {exc}"})
        if isinstance(exc, FixedOutsideError):  # fixed outside ratchet, the run resumes
            exc.resume = resume
        raise
    finally:
        if metrics is not None:
            metrics.close()  # the events since the last generation (the test means) first; never raises
        lease.release()
        run.ledger.close()
        if close_executor:
            run.executor.close()
        os.close(lock_fd)


def start_run(spec: RunSpec, runs_dir: str | Path = "runs", run_id: str | None = None, *,
              executor: Executor | None = None, progress: ProgressFn | None = None,
              storage: str | None = None) -> RunResult:
    """Start a new run of ``spec`` in ``runs_dir/run_id`` and drive it to the end.

    Args:
        spec: Validated run spec.
        runs_dir: Folder that holds run directories.
        run_id: Directory name; default ``<spec.name>-<timestamp>-<hex>``.
        executor: Where episodes run; default a process pool per ``[execution]`` (closed at the end;
            an executor passed in stays open, so one pool can serve many runs).
        progress: Called after each generation with a dict: ``generation``, ``best_train_mean`` (None
            when no contender finished cleanly), ``incumbent_validation_mean``, ``incumbent_id``,
            ``gated``, ``promoted``, ``gate_note`` (why no gate ran, or the gate's verdict, one line),
            ``usage`` (:class:`ratchet.planner.Usage`: env steps, episodes, validation env steps,
            seconds), ``budget`` (the spec's ``[budget]``), ``replayed`` (True for a generation a resumed run
            read back from the ledger rather than ran) and more (see the ``generation_finished``
            event). :class:`ratchet.progress.ProgressPrinter` prints it as ``ratchet run`` does. With
            ``[logging] tensorboard`` in the spec, each generation's scalars are written first
            (:mod:`ratchet.metrics`), for a resumed run (:func:`resume_run`) too.
        storage: Where the ledger goes: None for ``ledger.sqlite`` in the run directory, or a database
            URL (``postgresql://USER@HOST/DB``, ``sqlite:///PATH``) shared by many runs; the run directory
            then holds a ``ledger.json`` pointer to it (without the password).

    Returns:
        The :class:`RunResult`.

    Raises:
        SpecError: the spec is invalid (checked again here: ``model_copy`` skips validation), e.g. its
            budget cannot pay for the starting policy's first validation, or its ``[logging] tensorboard``
            folder cannot be written (or tensorboardX is not installed); or, with every episode priced at the time
            limit, the budget cannot pay for a single generation (``"budget: no room for a single generation …"``,
            :meth:`~ratchet.planner.Pricing.first_generation_unaffordable`).
        PolicyError: the policy file is invalid.
        LedgerError: bad storage URL or unreachable database.
        RatchetError: the run directory or the database already holds this run (use :func:`resume_run`).
    """
    spec_from_dict(spec.to_dict(), spec.base_dir)
    check_logging(spec.logging.tensorboard)
    task = task_from_spec(spec.task)
    spaces = task.spaces()  # the environment, made once with no policy code: setup problems fail here, in one line
    SeedSplits(spec.seed, task.seed_pools()).check_sizes(spec.gate.validation_episodes, spec.test.episodes,
                                                         spec.planner.train_episodes)
    program, start, start_blobs = load_start(spec, task, spaces)
    run_id = run_id or new_run_id(spec.name)
    if not is_run_id(run_id):
        raise RatchetError(f"run id {run_id!r} must be a plain name (letters, digits, '.', '_', '-'; no '/' or '..')")
    if Path(runs_dir).exists() and not Path(runs_dir).is_dir():
        raise RatchetError(f"--runs-dir {runs_dir} is a file; give a folder for run directories")
    if (Path(runs_dir) / LEDGER_FILE).exists() or (Path(runs_dir) / POINTER_FILE).exists():
        raise RatchetError(f"--runs-dir {runs_dir} is a run's own directory; give the folder that holds runs "
                           f"({Path(runs_dir).parent})")
    run_dir = Path(runs_dir) / run_id
    if (run_dir / LEDGER_FILE).exists() or (run_dir / POINTER_FILE).exists():
        raise RatchetError(f"run {run_id} already exists in {runs_dir}; pick another --run-id "
                           f"(or `ratchet resume {run_dir}` if it was interrupted)")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RatchetError(f"{run_dir} exists and is not a run directory; pick another --run-id or --runs-dir")
    url = storage_url(storage)
    check_refiners(spec)
    ledger = open_store(url, run_dir, run_id) if url else None  # a bad URL fails before any folder is made
    own_executor, lock_fd = executor is None, None
    try:
        if ledger is not None and ledger.get("run_started") is not None:
            raise RatchetError(f"{ledger.location} already exists; pick another --run-id "
                               f"(or `ratchet resume {run_id} --storage URL` if it was interrupted)")
        # an executor that cannot start (Ray unreachable, isolation required but missing) fails here,
        # before any run directory exists
        executor = executor or _executor_for(spec)
        made = not run_dir.exists()  # else an empty folder the user named: emptied again, not removed, on failure
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            # atomic: of two runs racing for one id, one gets it; 0700: policy code (nobody) cannot read it
            run_dir.mkdir(mode=0o700, exist_ok=run_dir.is_dir())
            lock_fd = lock_run_dir(run_dir)
            if program.source and spec.policy.kind not in FOLDER_KINDS:  # a folder is in the ledger (`ratchet export`)
                (run_dir / "policy.py").write_text(program.source, encoding="utf-8")
            if url:
                write_pointer(run_dir, url, run_id)
        except FileExistsError:
            raise RatchetError(f"run {run_id} already exists in {runs_dir}; pick another --run-id") from None
        except OSError as exc:
            raise RatchetError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
    except BaseException:
        if ledger is not None:
            ledger.close()
        if own_executor and executor is not None:
            executor.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    ledger = ledger or open_store(None, run_dir, run_id)
    try:
        for data in start_blobs.values():  # before any event names them
            ledger.put_artifact(data)
        run = _Run(run_dir, spec, program, ledger, executor, progress, start=start, task=task)
        unaffordable = run.prices.first_generation_unaffordable(list(run.refiners.values()))
        if unaffordable is not None:  # known before any episode: not after spending validation and test on it
            raise SpecError(unaffordable)
    except BaseException:  # e.g. a refiner refused its input files: no run began, so no run directory is left
        ledger.close()
        if own_executor:
            executor.close()
        os.close(lock_fd)
        for path in [run_dir] if made else list(run_dir.iterdir()):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        raise
    try:
        lease: WriterLease | None = WriterLease.acquire(ledger, run_id)
    except WriterLeaseError:  # another process took this run id between our checks and now
        lease = None
    created = lease is not None and ledger.append(EventType.RUN_STARTED, "run_started", {
        "run_id": run_id, "spec": spec.to_dict(), "policy_source": program.source, "policy_path": str(spec.policy_path),
        "task": run.task.to_dict(), "versions": _versions(), "pid": os.getpid(), "host": socket.gethostname(),
        "execution": _describe(run.executor), "pricing": run.pricing, "start_candidate": start.to_dict(),
        "inputs": dict(run.inputs),
        "seeds": {"validation": run.validation_seeds, "test": run.test_seeds,
                  "train": "fresh each generation: SeedSplits(run_seed).seeds('train', ...)"}})[1]
    if not created or lease is None:  # another process started this run id between our checks and now
        if lease is not None:
            lease.release()
        if own_executor:
            executor.close()
        ledger.close()
        os.close(lock_fd)
        raise RatchetError(f"run {run_id} was started by another process just now; pick another --run-id")
    return _drive(run, close_executor=own_executor, lock_fd=lock_fd, lease=lease,
                  resume=f"ratchet resume {run_dir}" + (" --storage URL" if url else ""))


def _describe(executor: Executor) -> dict[str, Any]:
    """:meth:`Executor.describe`, or only the executor's class name where a custom executor's description fails."""
    try:
        return executor.describe()
    except Exception:  # noqa: BLE001 - a custom executor's description must never stop a run from starting
        return {"backend": type(executor).__name__}


def check_refiners(spec: RunSpec) -> None:
    """Each refiner kind's look at what it needs outside ratchet (an LLM endpoint: reachable, the key
    accepted, the model listed), before a new run spends anything (:attr:`RefinerKind.check`).

    Raises:
        RatchetError: one line saying what to fix (an :class:`~ratchet.errors.EndpointError` for an endpoint).
    """
    entries = spec.refiner_entries()
    for entry, name in zip(entries, arm_names(entries)):
        kind = refiner_kind(entry["kind"])
        if kind.check is not None:
            kind.check(kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")}), name)



def load_program(path: str | Path, task: Task, dims: dict[str, int] | None = None) -> PolicyProgram:
    """:func:`ratchet.policy.load_policy` for ``task``: array shapes written as ``"obs"``/``"act"`` are
    resolved from the task's spaces (the driver makes the env for that; it never runs policy code).

    Raises:
        PolicyError: the policy file is invalid.
        TaskError: the policy needs the task's sizes and its environment cannot be made.
    """
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        source = ""  # load_policy says what is wrong
    if uses_task_dims(source) and dims is None:
        dims = task.dims()
    return load_policy(path, dims=dims if uses_task_dims(source) else None, functions=task.functions)


def load_start(spec: RunSpec, task: Task, spaces: tuple[Any, Any] | None = None
               ) -> tuple[PolicyProgram, Candidate, dict[str, bytes]]:
    """The run's starting point for ``[policy]`` of any kind: the program (empty for network kinds), the
    starting candidate and its artifacts' bytes by digest (see :func:`ratchet.policies.start.start_candidate`).

    Raises:
        PolicyError: the policy file or model is invalid.
        TaskError: the environment cannot be made (network kinds need its spaces).

    Args:
        spec: The run spec.
        task: Its task.
        spaces: The task's ``(observation_space, action_space)`` when already made (else made when needed).
    """
    from ratchet.policies.start import start_candidate
    from ratchet.policy import space_dims

    kind = spec.policy.kind
    if kind in FOLDER_KINDS:  # a folder: its regions' numbers are the parameters, the task's functions its calls
        from ratchet.policies.source import read_folder

        p = spec.policy
        folder = read_folder(spec.policy_path, p.build, p.run, tuple(task.functions), build_timeout_s=p.build_timeout_s,
                             build_memory_mb=p.build_memory_mb, max_output_bytes=p.max_output_bytes,
                             only=p.files)
        return start_candidate(spec.policy, spec.base_dir, None, spec.seed, folder)
    if kind != "program" and "act" not in task.functions:
        from ratchet.errors import PolicyError

        raise PolicyError(f"[policy] kind = {kind!r} maps observations to actions, but {task.name} calls "
                          f"{', '.join(task.functions)}(); use kind = \"program\" (a policy file defining them)")
    if spaces is None and kind in SPACE_KINDS:
        spaces = task.spaces()
    dims = space_dims(*spaces) if spaces is not None and spaces[0] is not None else None
    program = load_program(spec.policy_path, task, dims) if kind in SOURCE_KINDS else None
    return start_candidate(spec.policy, spec.base_dir, spaces if kind in SPACE_KINDS else None, spec.seed, program)


def _executor_for(spec: RunSpec) -> Executor:
    return executor_from_spec(spec.execution)


def resume_run(run: str | Path, runs_dir: str | Path = "runs", *, executor: Executor | None = None,
               progress: ProgressFn | None = None, storage: str | None = None) -> RunResult:
    """Continue a run that was interrupted (Ctrl-C, crash, ``kill -9``).

    The spec and policy come from the ledger, not from files that may have changed since. A run
    found only in ``storage`` (started on another machine) gets a run directory ``runs_dir/RUN_ID``
    with a pointer to its database.

    Only one process writes a run at a time, on any machine: resuming takes the run's writer lease
    (:class:`~ratchet.ledger.lease.WriterLease`), which a live writer holds and renews. A writer that
    died on this host is noticed at once; one on another host (same ``--storage`` database) once its
    lease expired, ``$RATCHET_LEASE_TTL_S`` (default 60) seconds after its last heartbeat.

    Args:
        run: Run id or run directory.
        runs_dir: Folder that holds run directories.
        executor: As for :func:`start_run`.
        progress: As for :func:`start_run`.
        storage: Database URL to look the run up in (see :func:`open_run`).

    Raises:
        RunNotFoundError: no such run.
        WriterLeaseError: another live process is writing the run (here or on another machine).
        LedgerError: the run already finished or its ledger has no start event.
    """
    ledger, run_dir, lock_fd, lease = open_for_writing(run, runs_dir, storage=storage)
    try:
        events = ledger.read()
        started = started_event(ledger)
        if ledger.get("run_finished") is not None:
            hint = (f"`ratchet show {run} --storage URL`" if storage else f"`ratchet show {run_dir}`")
            if unfinished_round(events) is not None:
                hint += f"; `ratchet correct {run} --resume-round` finishes its correction round"
            raise LedgerError(f"run {started.payload['run_id']} already finished; {hint}")
        r, lock_fd = rebuild_run(ledger, run_dir, lock_fd, executor, progress, storage)
    except BaseException:
        lease.release()
        ledger.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    r.continue_clock(active_seconds(events))
    ledger.append(EventType.RUN_RESUMED, f"resumed/{time.time()}", {"pid": os.getpid(), "host": socket.gethostname(),
                                                                      "events_before": len(events)})
    return _drive(r, close_executor=executor is None, lock_fd=lock_fd, lease=lease,
                  resume=f"ratchet resume {run_dir}" + (" --storage URL" if storage else ""))


def spec_of(ledger: LedgerStore) -> RunSpec:
    """The run's spec as its ``run_started`` event recorded it (not the file, which may have changed since). A run
    recorded before ``[planner] final``, ``reject_duplicates`` or ``cascade_episodes`` existed keeps the loop it was
    started with (``final = false``, ``reject_duplicates = false``, ``cascade_episodes = 0``), so resuming it
    recomputes the same events."""
    return recorded_spec(started_event(ledger).payload["spec"])


def recorded_spec(data: dict[str, Any]) -> RunSpec:
    """A spec as a ledger recorded it (:meth:`RunSpec.to_dict`, every setting written out), read with the defaults of
    the code that recorded it where they have changed since: without ``[planner] final`` or ``reject_duplicates`` it
    was ``false``, without ``cascade_episodes`` 0 (no cascade), without ``[model] judge`` ``"kept"``, without
    ``unscreened`` ``"all"``; a
    ``[[refiners]]`` table without a setting its kind added later reads as the kind's ``recorded_defaults`` say (an
    ``llm`` table without ``concurrency`` sent its requests one at a time)."""
    data = copy.deepcopy(data)
    planner = data.setdefault("planner", {})
    if isinstance(planner, dict):
        planner.setdefault("final", False)
        planner.setdefault("reject_duplicates", False)  # a run recorded before it evaluated duplicates again
        planner.setdefault("cascade_episodes", 0)  # a run recorded before cascades evaluated every seed
        planner.setdefault("overlap_gate", False)  # a run recorded before validation overlapped the next generation
    model = data.get("model")
    if isinstance(model, dict):
        model.setdefault("judge", "kept")  # a screen recorded before controls judged it: its rank correlation did
        model.setdefault("unscreened", "all")  # recorded before: its first generation ran every proposal
    tables = data.get("refiners")
    for entry in tables if isinstance(tables, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("kind"), str):
            try:
                kind = refiner_kind(entry["kind"])
            except KeyError:  # an unknown kind: validation says so in one line
                continue
            for name, value in kind.recorded_defaults.items():
                entry.setdefault(name, value)
    return spec_from_dict(data, where="ledger spec")


def rebuild_run(ledger: LedgerStore, run_dir: Path, lock_fd: int | None, executor: Executor | None = None,
                progress: ProgressFn | None = None, storage: str | None = None) -> tuple[_Run, int]:
    """The run's wiring rebuilt from its ``run_started`` event (spec, policy, starting candidate, inputs), for
    a writer that holds the run (:func:`open_for_writing`). A run found only in ``storage`` (started on
    another machine) gets a run directory here with a pointer to its database, and its lock. Without an
    ``executor``, a process pool per the spec's ``[execution]`` is started (last: nothing leaks when an
    earlier step fails); the caller closes it.

    Returns:
        ``(run, lock_fd)``.

    Raises:
        SpecError, PolicyError: the recorded spec or policy no longer loads (package versions changed).
        RatchetError: the run directory cannot be created.
    """
    started = started_event(ledger)
    spec = spec_of(ledger)
    source = started.payload["policy_source"]
    # the task as the run recorded it (an evaluator's source included), not as its files are now
    task = task_from_dict(started.payload["task"]) if "task" in started.payload else task_from_spec(spec.task)
    dims = task.dims() if spec.policy.kind in SOURCE_KINDS and uses_task_dims(source) else None
    program = read_program(spec.policy.kind, source, started.payload.get("policy_path", "<policy>"), dims=dims,
                           functions=task.functions)  # a network: an empty program
    if not run_dir.exists():  # found only in the database: give it a run directory here
        try:
            run_dir.mkdir(mode=0o700, parents=True)
            if program.source and spec.policy.kind not in FOLDER_KINDS:
                (run_dir / "policy.py").write_text(program.source, encoding="utf-8")
            if storage is not None:  # a run found only in a database (always so here: it had no directory)
                write_pointer(run_dir, storage, started.payload["run_id"])
        except OSError as exc:
            raise RatchetError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
    if lock_fd is None:
        lock_fd = lock_run_dir(run_dir)
    start = (Candidate.from_dict(started.payload["start_candidate"]) if "start_candidate" in started.payload
             else program.candidate())
    return _Run(run_dir, spec, program, ledger, executor or _executor_for(spec), progress,
                pricing=started.payload.get("pricing", "worst-case"),
                start=start, inputs=started.payload.get("inputs", {}), task=task), lock_fd
