"""The Refiner contract: what the loop calls on every refiner kind, and nothing else.

The loop calls every method below, every generation, without asking what a refiner holds (Optuna's
``BaseSampler`` shape: a few abstract methods and hooks with defaults that the study always calls). A kind
subclasses :class:`Refiner`, implements :meth:`~Refiner.propose` and :meth:`~Refiner.generation_cost`, and
overrides the hooks it needs; a kind defines nothing only for the loop.

One generation, as the loop drives it::

    refiner.turn(generation)         # several refiners: whether work it prepared claims this generation (or waits)
    refiner.idle_reason()            # None: it may take this generation
    refiner.budget_spent()           # when idle: whether its own budget retired it (the run's stop is a budget)
    refiner.generation_cost()        # priced before anything runs; fit(room) may cut it to the budget's rest
    refiner.recommend()              # its best guess so far (evaluated beside the proposals), or None
    refiner.propose(parent, critique, rng)  # new candidates (possibly after training jobs)
    every_refiner.prepare(parent, critique, rng)  # start work for a later propose now (default: nothing)
    refiner.take_rejections()        # what it screened out itself, recorded as proposal_rejected
    refiner.refused(reasons)         # what the loop refused before any episode (failed checks, duplicates)
    refiner.dropped(reasons)         # what the cascade dropped after its first stage ([planner] cascade_episodes)
    refiner.observe(evaluations)     # training evaluations of its proposals (and recommendation), then the parent's
    refiner.verdict(candidate_id, promoted, note)  # what the gate said of the generation's contender
    refiner.proposes_without_verdict()  # True: the next propose may come before the verdict ([planner] overlap_gate)
    refiner.summary()                # numbers for the progress line, the ledger and ``show``

and once, when the run ends (before ``run_finished``)::

    every_refiner.finish()           # work still out is settled and recorded; facts for ``run_finished``
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from ratchet.critic import Critique, Evaluation
from ratchet.policy import Candidate
from ratchet.proposals import Rejection

__all__ = ["GenerationCost", "Refiner", "Turn"]


@dataclass(frozen=True)
class GenerationCost:
    """What one generation of a refiner costs before its gate, in every budget unit.

    Attributes:
        proposals: Most candidates :meth:`Refiner.propose` returns (each is evaluated on the generation's
            training seeds).
        recommends: Whether :meth:`Refiner.recommend` may return a candidate (evaluated beside them).
        training_env_steps: Env steps of the training jobs :meth:`Refiner.propose` runs (charged in full).
        requests: Most requests to an outside service (an LLM endpoint; HTTP attempts, retries included).
        tokens: Most answer (completion) tokens those requests may use.
        reference: Whether :meth:`Refiner.observe` needs the incumbent's evaluation on the same training seeds (the
            last one it receives: a paired reference, as ``mutate`` and ``llm`` score their proposals). False lets a
            run whose decisions do not need it either (``[planner] decide = "powered"``, no weakness pool) skip that
            re-run; the loop still passes the incumbent's evaluation whenever it ran one.
    """

    proposals: int
    recommends: bool = False
    training_env_steps: int = 0
    requests: int = 0
    tokens: int = 0
    reference: bool = True

    def evaluations_with(self, reference: bool) -> int:
        """Candidates evaluated on the training seeds: the proposals, the recommendation when there is one, and the
        incumbent (the paired reference) when ``reference``."""
        return int(self.proposals) + int(reference) + int(self.recommends)

    @property
    def evaluations(self) -> int:
        """:meth:`evaluations_with` the incumbent when the refiner asks for it (:attr:`reference`)."""
        return self.evaluations_with(self.reference)


class Turn(Enum):
    """A refiner's word on who takes a generation when several share a run (:meth:`Refiner.turn`), read by the
    allocator (:class:`~ratchet.refiners.allocation.ThompsonAllocator`)."""

    FREE = "free"  #: the allocator chooses as it would (the default)
    DUE = "due"  #: work the refiner prepared is due at this generation: it takes it (the first such, in order)
    WAIT = "wait"  #: work it prepared is still coming: it sits out while another refiner can take the generation


class Refiner(ABC):
    """Proposes candidates from a parent and its critique; learns from their evaluations.

    Attributes:
        name: The refiner's arm name (recorded as its candidates' ``refiner``).
    """

    name: str

    @abstractmethod
    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """New candidates derived from ``parent`` (the incumbent), at most ``generation_cost().proposals``.

        Args:
            parent: The incumbent.
            critique: The incumbent's latest training critique (None before the first generation).
            rng: The run's generator (seeded; the same draws on replay).
        """

    @abstractmethod
    def generation_cost(self) -> GenerationCost:
        """What the next generation will cost (asked before :meth:`propose`; the same until it runs)."""

    def prepare(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> None:
        """Start work for a later :meth:`propose` now, in the background (an ``llm`` refiner's ``ahead``: the next
        generation's requests go out while this generation's episodes run). Called on every refiner right after each
        generation's :meth:`propose` (whichever refiner took it), before its episodes, with the same incumbent,
        critique and run generator: fixed points, so a resumed run calls it at the same points with the same draws.
        It must not block on outside services (send, never wait). Default: nothing."""

    def turn(self, generation: int) -> Turn:
        """Whether work :meth:`prepare` started claims ``generation`` (:attr:`Turn.DUE`: the allocator gives it this
        refiner), keeps it out of this one (:attr:`Turn.WAIT`: its work is still coming; it takes the generation only
        where no other refiner can), or neither (:attr:`Turn.FREE`). Asked before each generation where several
        refiners share the run; the loop records the answers that are not :attr:`Turn.FREE` with the generation's plan
        (``generation_planned``'s ``turns``) and a resumed run reads them back instead of asking, so an answer may
        depend on timing (an ``llm``'s ``lag = "auto"``: whether a wave's answers are in) and a resumed run still
        gives the same generations to the same refiners. Default: :attr:`Turn.FREE`."""
        return Turn.FREE

    def finish(self) -> dict[str, Any]:
        """The run ends: work :meth:`prepare` started and no :meth:`propose` took is settled and recorded (an ``llm``
        refiner's requests sent ahead: awaited and recorded, making no candidates). Returns JSON-ready facts for
        ``run_finished`` (empty: nothing to say). Default: nothing to settle."""
        return {}

    def take_rejections(self) -> list[Rejection]:
        """Proposals the last :meth:`propose` screened out itself (e.g. an LLM's edit that does not apply),
        handed over once; the loop records them. Default: none."""
        return []

    def refused(self, reasons: Mapping[str, str]) -> None:
        """The proposals of the last :meth:`propose` the loop refused before any episode ran, by candidate id: why,
        one line (failed checks, values out of bounds, or ``duplicate: ...`` for one the run has already scored;
        each also recorded as ``proposal_rejected``). Called every generation, before :meth:`observe` (which gets no
        evaluation of them). Default: nothing kept."""

    def dropped(self, reasons: Mapping[str, str]) -> None:
        """The candidates of the last :meth:`propose` (or :meth:`recommend`) the cascade dropped after its first stage
        (``[planner] cascade_episodes``), by candidate id: why, one line (each also recorded as
        ``proposal_rejected``). Called every generation, before :meth:`observe`, which gets their first-stage
        evaluations (fewer episodes than the others'; they rank below every candidate that went on). Default:
        nothing kept."""

    def observe(self, evaluations: Sequence[Evaluation]) -> None:
        """Training evaluations of the candidates of the last :meth:`propose`, then of :meth:`recommend`'s candidate
        when it was evaluated beside them, then those the cascade dropped (:meth:`dropped`: on the first-stage seeds
        only), then the parent's on the same seeds (a reference for paired comparisons; present when the incumbent
        ran, always with ``generation_cost().reference`` or a cascade). Default: nothing learnt."""

    def recommend(self) -> Candidate | None:
        """The refiner's current best guess (CMA-ES's distribution mean), evaluated beside the proposals when
        ``generation_cost().recommends``; None otherwise. Default: None."""
        return None

    def fit(self, room_env_steps: int) -> bool:
        """Cut the next generation to ``room_env_steps`` env steps (the budget's rest after its episodes and
        gate) when its full cost no longer fits; True when it did (the next :meth:`generation_cost` says the
        cut cost). Default: it cannot be cut."""
        return False

    def idle_reason(self) -> str | None:
        """Why this refiner takes no more generations (its rounds are done, its training or endpoint keeps
        failing), one line; None while it can go on. Default: None."""
        return None

    def budget_spent(self) -> bool:
        """Whether :meth:`idle_reason` is the refiner's own budget (an ``llm`` refiner's ``budget_requests``,
        ``budget_tokens`` or ``budget_cost``): it retired, and a run that no refiner can go on with then ended on a
        budget (``stop_kind`` ``"budget"``, followed by the final decision). Default: False."""
        return False

    def verdict(self, candidate_id: str | None, promoted: bool, note: str) -> None:
        """What the gate said of the generation's contender (None when no contender reached a gate), and its
        one-line note. Default: nothing kept."""

    def proposes_without_verdict(self) -> bool:
        """Whether the next :meth:`propose` (and :meth:`recommend`, :meth:`generation_cost`, :meth:`idle_reason`) may
        come before :meth:`verdict` of the last generation, with the incumbent from before that verdict, and return the
        same candidates (ids) as after it: the refiner follows its own path and a promotion changes nothing it does.
        Lets the run validate a generation's contender beside the next generation's episodes (``[planner]
        overlap_gate``); the proposals' ``parent_id`` then names the incumbent they were proposed from. Default:
        False."""
        return False

    def summary(self) -> dict[str, Any]:
        """JSON-ready numbers of the refiner's state for the progress line, ``generation_finished`` and
        ``show`` (e.g. CMA-ES's ``sigma`` and ``restarts``). Default: none."""
        return {}
