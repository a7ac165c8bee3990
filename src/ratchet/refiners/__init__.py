"""Refiners propose new candidates from a parent and a critique.

A refiner implements two methods (Optuna's sampler shape): :meth:`Refiner.propose` and
:meth:`Refiner.observe`, plus :meth:`Refiner.recommend` for its current best guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ratchet.critic import Critique, Evaluation
from ratchet.policy import Candidate
from ratchet.refiners.allocation import ThompsonAllocator
from ratchet.refiners.cmaes import CMAESRefiner

__all__ = ["Refiner", "CMAESRefiner", "ThompsonAllocator"]


class Refiner(Protocol):
    """Proposes candidates; learns from their training evaluations."""

    name: str

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """New candidates derived from ``parent`` (usually the incumbent)."""

    def observe(self, evaluations: Sequence[Evaluation]) -> None:
        """Training evaluations of the candidates from the last :meth:`propose`, followed by the parent's
        on the same seeds (a reference for paired comparisons; refiners that need none ignore it)."""

    def recommend(self) -> Candidate | None:
        """The refiner's current best guess (e.g. CMA-ES's distribution mean), or None. A refiner that never
        recommends may say so with a class attribute ``recommends = False``: the loop then prices its
        generations without that extra evaluation."""
