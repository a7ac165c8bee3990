"""The decider contract: when and how the gate decides (``[planner] decide``), one class per mode.

The loop calls every method of :class:`Decider` on every run, whatever the mode, and never asks which mode it
runs: :meth:`~Decider.start` with the incumbent's first validation, :meth:`~Decider.observe` and
:meth:`~Decider.decide` every generation (a :class:`~ratchet.step.GenerationStep` in, a typed :class:`Outcome`
out), :meth:`~Decider.progressed` for patience, and :meth:`~Decider.concludes` / :meth:`~Decider.conclude` when
the search stops (the final decision). Every mode keeps the search's best undecided candidates on a
:class:`~ratchet.shortlist.Shortlist`, which the final decision certifies (:mod:`ratchet.deciders.certify`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ratchet.critic import Evaluation
from ratchet.gate import Decision
from ratchet.planner import Budget, IncumbentPlanner, Pricing, Stop
from ratchet.policy import Candidate
from ratchet.shortlist import Shortlist
from ratchet.step import GenerationStep

if TYPE_CHECKING:
    from ratchet.deciders.certify import Certifier
    from ratchet.services import RunServices

__all__ = ["Decider", "Outcome", "paired_sd"]


@dataclass(frozen=True)
class Outcome:
    """What a decider decided in one generation.

    Attributes:
        decision: The gate's decision, or None when no gate ran.
        note: One line: the gate's verdict, or why no gate ran.
        incumbent_validation: The incumbent's validation evaluation after it (a sequential gate may have extended it
            to more seeds).
        candidate: The candidate the outcome is about: the one gated; with ``decide = "every"`` the generation's
            best contender also when no gate ran (the refiner's verdict names it); None when there is none.
        candidate_validation: ``candidate``'s validation evaluation when a gate ran, else None.
    """

    decision: Decision | None
    note: str
    incumbent_validation: Evaluation
    candidate: Candidate | None = None
    candidate_validation: Evaluation | None = None

    @property
    def promoted(self) -> bool:
        """Whether the gate promoted :attr:`candidate` (it then holds a validation evaluation)."""
        return (self.decision is not None and self.decision.promoted and self.candidate is not None
                and self.candidate_validation is not None)

    @property
    def gain(self) -> float:
        """The promoted candidate's validation mean over the incumbent's (return units); 0 without a promotion."""
        if not self.promoted or self.candidate_validation is None:
            return 0.0
        return self.candidate_validation.mean - self.incumbent_validation.mean


def paired_sd(cand_val: Evaluation, inc_val: Evaluation) -> float | None:
    """Standard deviation of a decision's paired validation differences (return units); None after an error or
    with fewer than 2 pairs."""
    if cand_val.n_errors or cand_val.n < 2:
        return None
    return float((cand_val.returns - inc_val.returns[:cand_val.n]).std(ddof=1))


class Decider(ABC):
    """When and how the gate decides: a mode of ``[planner] decide``.

    Args:
        services: The run's recorded services (evaluations, gate decisions, usage; :class:`~ratchet.services.
            RunServices`).
        planner: The run's planner (screens contenders, holds validation that would overspend).
        prices: What work costs against the budget (:class:`~ratchet.planner.Pricing`).
        budget: The run's budget.
        certifier: Confirms and certifies the shortlist's best (:class:`~ratchet.deciders.certify.Certifier`);
            it holds the shortlist.
    """

    #: Whether the incumbent runs on every generation's training seeds beside its contenders (a paired reference the
    #: decisions read); the run prices that rerun (:class:`~ratchet.planner.Pricing` ``reference``).
    pairs_with_incumbent: ClassVar[bool] = True

    def __init__(self, services: RunServices, planner: IncumbentPlanner, prices: Pricing, budget: Budget,
                 certifier: Certifier) -> None:
        self.services, self.planner, self.prices, self.budget = services, planner, prices, budget
        self.certifier = certifier

    @property
    def shortlist(self) -> Shortlist:
        """The best candidates no gate has decided yet (the final decision's pool)."""
        return self.certifier.shortlist

    def start(self, validation: Evaluation) -> None:
        """The starting incumbent's first validation evaluation: the shortlist's baseline until the incumbent has
        training returns."""
        self.shortlist.fallback = validation.mean

    def observe(self, step: GenerationStep, longest: float) -> float:
        """Take in a generation that ran (its clean contenders go on the shortlist) and return the longest mean
        episode length (env steps) the decisions read from now on, ``longest`` until now: what a gate is priced
        from. By default the shortlist's candidates that a decision would confirm and the incumbent."""
        self.shortlist.observe(step.generation, list(step.contenders), step.train, step.incumbent, step.recommended)
        inc_val, top = step.incumbent_validation, self.services.spec.planner.confirm_top
        return max(self.shortlist.longest(top), inc_val.env_steps / max(1, inc_val.n))

    def gated(self, step: GenerationStep) -> Candidate | None:
        """The candidate :meth:`decide` will validate for ``step``, known before any of its validation runs (its first
        look is then the gate's first batch, against ``step``'s incumbent), or None: none, or not known ahead (a
        decision that confirms a shortlist first). Lets the run start that validation beside the next generation's
        episodes (``[planner] overlap_gate``, :mod:`ratchet.overlap`). Default: None."""
        return None

    @abstractmethod
    def decide(self, step: GenerationStep) -> Outcome:
        """This generation's decision (or why none was taken), recorded in the ledger by the services it calls."""

    def progressed(self, generation: int) -> bool:
        """Whether ``generation`` made progress that patience counts besides a promotion (default: none)."""
        return False

    @abstractmethod
    def concludes(self, stop: Stop) -> bool:
        """Whether the search stopped for ``stop`` ends with the final decision (:meth:`conclude`)."""

    def conclude(self, generation: int, incumbent: Candidate, validation: Evaluation) -> tuple[Candidate, Evaluation]:
        """The final decision over the shortlist (:meth:`~ratchet.deciders.certify.Certifier.final_decision`): the
        incumbent and its validation evaluation after it."""
        return self.certifier.final_decision(generation, incumbent, validation)
