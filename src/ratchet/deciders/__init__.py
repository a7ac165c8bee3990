"""When and how the gate decides (``[planner] decide``): one :class:`Decider` per mode behind one contract
(:mod:`ratchet.deciders.base`), which the run loop calls without asking which mode it runs.

- ``"every"``: :class:`~ratchet.deciders.every.EveryGeneration`, each generation's best contender;
- ``"powered"``: :class:`~ratchet.deciders.powered.Powered`, the shortlist's best when a decision is likely to pass;
- ``"end"``: :class:`~ratchet.deciders.powered.AtTheEnd`, once, when the search ends;
- ``"exact"``: :class:`~ratchet.deciders.exact.Exact`, a deterministic task's: a strict improvement confirmed by an
  exact re-evaluation, no statistics.

Every statistical mode ends with the final decision over the shortlist (:mod:`ratchet.deciders.certify`) where it concludes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratchet.deciders.base import Decider, Outcome, paired_sd
from ratchet.deciders.certify import Certifier
from ratchet.deciders.every import EveryGeneration
from ratchet.deciders.exact import Exact
from ratchet.deciders.powered import AtTheEnd, Powered
from ratchet.planner import Budget, IncumbentPlanner, Pricing

if TYPE_CHECKING:
    from ratchet.services import RunServices

__all__ = ["DECIDERS", "AtTheEnd", "Certifier", "Decider", "EveryGeneration", "Exact", "Outcome", "Powered",
           "build_decider", "paired_sd"]

#: ``[planner] decide`` → its decider.
DECIDERS: dict[str, type[Decider]] = {"every": EveryGeneration, "powered": Powered, "end": AtTheEnd, "exact": Exact}


def build_decider(services: RunServices, planner: IncumbentPlanner, prices: Pricing, budget: Budget) -> Decider:
    """The decider of the run's ``[planner] decide`` (its spec is ``services.spec``), with its own certifier and
    shortlist."""
    cls = DECIDERS[services.spec.planner.decide]
    return cls(services, planner, prices, budget, Certifier(services, planner, prices, budget))
