"""``[planner] decide = "powered"`` and ``"end"``: the shortlist decides (:mod:`ratchet.shortlist`).

:class:`Powered` certifies the shortlist's best whenever a decision is likely to pass (and once more when the
search ends); :class:`AtTheEnd` lets the search spend the budget and decides once, when it ends.
"""

from __future__ import annotations

from ratchet.deciders.base import Decider, Outcome
from ratchet.planner import Stop, StopKind
from ratchet.step import GenerationStep

__all__ = ["AtTheEnd", "Powered"]


class Powered(Decider):
    """Certify the best candidate seen so far when a decision is likely to pass
    (:meth:`~ratchet.deciders.certify.Certifier.certify`); a run whose decisions read the shortlist needs no paired
    rerun of the incumbent every generation."""

    pairs_with_incumbent = False

    def decide(self, step: GenerationStep) -> Outcome:
        """The shortlist's best certified when the gate's power at the next level reaches ``[planner] power``, else
        why the search goes on."""
        return self.certifier.certify(step.generation, step.incumbent, step.incumbent_validation, step.next_cost,
                                      step.est_len)

    def progressed(self, generation: int) -> bool:
        """Whether ``generation`` put a new leader on the shortlist (patience counts generations without one)."""
        return self.shortlist.led_by(generation)

    def concludes(self, stop: Stop) -> bool:
        """Always, unless the run is broken: the budget, the clock, a target or patience ends the search with the
        final decision over the shortlist."""
        return stop.kind is not StopKind.BROKEN


class AtTheEnd(Powered):
    """The search spends the budget; the shortlist's best is decided once, when the search ends."""

    def decide(self, step: GenerationStep) -> Outcome:
        """No decision while the search goes on."""
        return Outcome(None, "decide = \"end\": the gate decides when the search ends", step.incumbent_validation)
