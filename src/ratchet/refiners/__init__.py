"""Refiners propose new candidates from a parent and a critique.

Every kind implements one contract, :class:`~ratchet.refiners.base.Refiner` (see :mod:`ratchet.refiners.base`):
the loop calls all of it, every generation, and nothing else.
"""

from __future__ import annotations

from ratchet.refiners.allocation import ThompsonAllocator
from ratchet.refiners.base import GenerationCost, Refiner
from ratchet.refiners.cmaes import CMAESRefiner

__all__ = ["CMAESRefiner", "GenerationCost", "Refiner", "ThompsonAllocator"]
