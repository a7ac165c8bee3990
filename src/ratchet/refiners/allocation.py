"""Several refiners, one budget: Thompson sampling over the promotion gains each has produced."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ratchet.refiners.base import Turn

__all__ = ["ThompsonAllocator"]


class ThompsonAllocator:
    """Chooses which refiner configuration (arm) gets the next generation.

    Each generation an arm earns a reward: the gain in the incumbent's validation mean when its
    candidate was promoted, else 0. The allocator keeps a Gaussian posterior over each arm's mean
    reward per generation (prior mean 0, prior weight one pseudo-generation, noise scale the pooled
    standard deviation of all rewards so far, or 1 before any reward varies) and picks the arm with
    the largest posterior sample (Thompson sampling; W. R. Thompson, Biometrika 1933; see Russo et al.,
    "A Tutorial on Thompson Sampling", 2018). Arms never tried are chosen first, in order.

    Sampling is seeded by (run seed, generation), so a resumed run makes the same choices.

    A refiner's word on the generation (:meth:`~ratchet.refiners.base.Refiner.turn`) comes first: one whose prepared
    work is due takes it (an ``llm`` refiner's ``lag``: the answers it sent ahead are used at a fixed generation, or
    with ``lag = "auto"`` at the first once they are in, whichever refiner the samples favour), and one whose work is
    still coming sits out while another can go on.

    Args:
        arms: Arm names, e.g. ``["cmaes-s0.1", "cmaes-s0.2", "cmaes-s0.4"]``.
        seed: The run seed.
    """

    def __init__(self, arms: Sequence[str], seed: int = 0) -> None:
        if not arms:
            raise ValueError("need at least one arm")
        self.arms = list(arms)
        self.seed = seed
        self.rewards: dict[str, list[float]] = {a: [] for a in self.arms}

    def choose(self, generation: int, available: Sequence[str] | None = None,
               turns: Mapping[str, Turn] | None = None) -> tuple[str, dict[str, Any]]:
        """The arm for ``generation`` and why (JSON-ready: per-arm n, mean gain, posterior sample).

        Args:
            generation: The generation number (seeds the posterior samples).
            available: The arms that may be chosen (default all; e.g. not those whose refiner is idle).
                Every arm's sample is drawn either way, so the choice among the others does not change.
            turns: Each arm's :class:`~ratchet.refiners.base.Turn` for this generation (missing: ``FREE``): the first
                available arm that is ``DUE`` is chosen; ``WAIT`` arms are passed over while another is available.
        """
        pick = [a for a in self.arms if available is None or a in available] or self.arms
        turns = turns or {}
        due = [a for a in pick if turns.get(a) is Turn.DUE]
        pick = [a for a in pick if turns.get(a) is not Turn.WAIT] or pick
        untried = [a for a in pick if not self.rewards[a]]
        all_rewards = [r for rs in self.rewards.values() for r in rs]
        scale = float(np.std(all_rewards)) if len(all_rewards) > 1 and np.std(all_rewards) > 0 else 1.0
        rng = np.random.default_rng([self.seed, generation, 11])
        stats: dict[str, dict[str, Any]] = {}
        for a in self.arms:
            rs = self.rewards[a]
            n = len(rs)
            mean = sum(rs) / (n + 1)  # prior: one pseudo-generation with reward 0
            sample = float(rng.normal(mean, scale / math.sqrt(n + 1)))
            stats[a] = {"generations": n, "mean_gain": (sum(rs) / n) if n else None,
                        "posterior_mean": mean, "sample": sample}
        if due:
            arm, why = due[0], "its work prepared ahead is due at this generation"
        elif untried:
            arm, why = untried[0], "not tried yet"
        else:
            arm = max(pick, key=lambda a: stats[a]["sample"])
            why = "largest posterior sample of mean promotion gain per generation"
        return arm, {"arm": arm, "reason": why, "arms": stats, "noise_scale": scale}

    def record(self, arm: str, gain: float) -> None:
        """Reward ``arm`` for one generation with ``gain`` (0 when nothing was promoted)."""
        self.rewards[arm].append(float(gain))
