"""One generation's record, as the run loop's phases hand it on: plan → propose → execute → critique → decide →
record (:meth:`ratchet.loop._Run.run`). Each phase returns a new :class:`GenerationStep` with its own fields filled
(``dataclasses.replace``); the decider (:mod:`ratchet.deciders`) reads one and returns its typed outcome."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ratchet.critic import Critique, Evaluation
from ratchet.planner import Plan
from ratchet.policy import Candidate
from ratchet.refiners import GenerationCost

__all__ = ["GenerationStep"]


@dataclass(frozen=True)
class GenerationStep:
    """One generation of the search.

    Attributes (by the phase that fills them):
        generation: 1-based generation number (plan).
        refiner: The name of the refiner configuration that takes it (plan; ``[[refiners]]`` ``name``).
        cost: What its generation costs, in every budget unit, once fitted to the budget (plan).
        reserve: (env steps, episodes) kept for the gate while it was planned (plan).
        plan: Its training seeds (plan; :class:`~ratchet.planner.Plan`).
        incumbent: The incumbent it starts from.
        incumbent_validation: The incumbent's validation evaluation when it starts.
        est_len: The episode length (env steps) work is priced at: the last generation's mean when planned, this
            one's after it ran (critique).
        rerun: Whether the incumbent runs on the training seeds beside the contenders: a paired reference (plan;
            False again when no contender is left, propose).
        contenders: The candidates evaluated on the training seeds: the proposals that passed their checks, then the
            refiner's recommendation (propose); those the cascade kept (execute).
        recommended: The refiner's recommendation (CMA-ES's distribution mean) among them, or None (propose).
        refused: Proposals refused before any episode ran, by their checks or the refiner's own (propose).
        failures: Requests to outside services (an LLM endpoint) that failed while the refiner proposed (propose).
        stopped: Why the refiner stopped when its outside service failed and the run goes on without it, or None
            (propose).
        idle: Why the refiner proposed nothing at all, in one line, when it can say (its
            :meth:`~ratchet.refiners.Refiner.idle_reason` once it had tried: e.g. no request was affordable, the
            ``[budget] money`` having no room for the next one's worst case), or None (propose).
        train: Each evaluated candidate's training evaluation on all the training seeds, by candidate id (execute).
        dropped: The contenders the cascade dropped after its first stage (``[planner] cascade_episodes``; execute
            takes them out of ``contenders`` and ``recommended``): why (one line) and their first-stage evaluation,
            by candidate id (execute).
        cut: Whether the executor's env-step cap cut the training episodes short: nothing is judged from them
            (execute).
        broken: Whether every episode of the generation failed before its first env step: the run stops after it
            (critique).
        longest: The longest mean episode length (env steps) a decision reads: what a gate is priced from
            (critique; :meth:`ratchet.deciders.Decider.observe`).
        incumbent_train: The incumbent's training evaluation when it ran on the training seeds, else None
            (critique).
        critique: The critique of ``incumbent_train``, or None (critique).
        best: The generation's best contender on the training seeds (:meth:`~ratchet.planner.IncumbentPlanner.
            gate_candidate`), or None when none finished cleanly (critique).
        next_cost: (env steps, episodes) the next generation and its kept gate are priced at, for a validation
            that must leave room for them (critique).
    """

    generation: int
    refiner: str
    cost: GenerationCost
    reserve: tuple[float, int]
    plan: Plan
    incumbent: Candidate
    incumbent_validation: Evaluation
    est_len: float
    rerun: bool = False
    contenders: tuple[Candidate, ...] = ()
    recommended: Candidate | None = None
    refused: int = 0
    failures: tuple[str, ...] = ()
    stopped: str | None = None
    idle: str | None = None
    train: Mapping[str, Evaluation] = field(default_factory=dict)
    dropped: Mapping[str, tuple[str, Evaluation]] = field(default_factory=dict)
    cut: bool = False
    broken: bool = False
    longest: float = 1.0
    incumbent_train: Evaluation | None = None
    critique: Critique | None = None
    best: Candidate | None = None
    next_cost: tuple[float, int] = (0.0, 0)
