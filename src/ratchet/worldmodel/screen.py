"""The screen's decisions: which proposals are paid for in real episodes, and whether the model still predicts.

A screen ranks a generation's proposals by their imagined returns (:mod:`ratchet.worldmodel.imagine`) plus an
optimism bonus for what the ensemble disagrees on (an upper confidence bound: the mean over members plus
``optimism`` standard deviations), and keeps the best. After their real episodes it compares the model's ranking of
the ones that ran with the real one (Spearman's rank correlation, ``scipy.stats.spearmanr``) and switches itself off
for the rest of the run when the correlation stays low: a screen that does not predict must not choose what is run.
Measured only among the best-ranked, the correlation reads low even for a model that ranks a whole generation well
(range restriction: benchmarks/RESULTS.md); unchosen candidates that ran (a recommendation, controls) widen it.
It never judges: the gate reads real validation episodes only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ScreenState", "choose", "optimistic", "rank_correlation"]


def optimistic(returns: np.ndarray, optimism: float) -> np.ndarray:
    """``(n, members)`` imagined returns → ``(n,)`` scores: mean over members + ``optimism`` × their std."""
    r = np.asarray(returns, np.float64)
    return r.mean(axis=1) + float(optimism) * (r.std(axis=1) if r.shape[1] > 1 else 0.0)


def choose(scores: Sequence[float], keep: int) -> list[int]:
    """Indices of the ``keep`` best scores, best first (ties: the earlier proposal first; a non-finite score last)."""
    s = [float(x) if math.isfinite(float(x)) else -math.inf for x in scores]
    return sorted(range(len(s)), key=lambda i: (-s[i], i))[:max(0, keep)]


def rank_correlation(predicted: Sequence[float], real: Sequence[float]) -> float | None:
    """Spearman's rank correlation of the model's scores with the real mean returns, or None where it says nothing
    (fewer than 3 pairs, or either side constant)."""
    from scipy.stats import spearmanr

    p, r = np.asarray(predicted, np.float64), np.asarray(real, np.float64)
    ok = np.isfinite(p) & np.isfinite(r)
    p, r = p[ok], r[ok]
    if len(p) < 3 or np.ptp(p) == 0 or np.ptp(r) == 0:
        return None
    rho = float(spearmanr(p, r).statistic)
    return rho if math.isfinite(rho) else None


@dataclass
class ScreenState:
    """Whether the screen is on, and its account so far.

    Attributes:
        min_correlation: The mean rank correlation of the last ``window`` judged generations below which it switches
            off.
        window: Generations it is judged over.
        on: Whether it still chooses what is run.
        correlations: Per judged generation, the rank correlation (None where it said nothing).
        saved: Proposals screened out (not run) so far.
        switched_off_at: The generation it switched off after, or None.
    """

    min_correlation: float = 0.2
    window: int = 3
    on: bool = True
    correlations: list[float | None] = field(default_factory=list)
    saved: int = 0
    switched_off_at: int | None = None

    def judge(self, generation: int, rho: float | None) -> bool:
        """Take one generation's rank correlation in; switch off when the last ``window`` ones that said something
        average below ``min_correlation``. Returns whether the screen is still on."""
        self.correlations.append(rho)
        seen = [r for r in self.correlations if r is not None][-self.window:]
        if self.on and len(seen) >= self.window and float(np.mean(seen)) < self.min_correlation:
            self.on, self.switched_off_at = False, generation
        return self.on
