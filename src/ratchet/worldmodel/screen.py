"""The screen's decisions: which proposals are paid for in real episodes, and whether the model still predicts.

A screen ranks a generation's proposals by their imagined returns (:mod:`ratchet.worldmodel.imagine`) plus an
optimism bonus for what the ensemble disagrees on (an upper confidence bound: the mean over members plus
``optimism`` standard deviations), and keeps the best. After their real episodes it is judged, and switches itself
off for the rest of the run when it does no better than chance: a screen that does not predict must not choose what
is run. It is judged by its **controls** (``[model] controls``: screened-out proposals drawn at random and run
anyway): every pair of a kept candidate and a control of the same generation is a win for the screen when the kept
one's real training mean is higher (a tie counts half). The wins over all pairs so far give its **advantage**,
``(wins - losses) / pairs`` — the rank-biserial correlation between "the screen kept it" and the real return, from
-1 to 1, 0 for a screen no better than a random pick. Without controls nothing unbiased judges it and it stays on.
Spearman's rank correlation of the model's scores with the real returns of what ran is recorded too, but read among
what the screen chose (its best-ranked) it is biased low (range restriction: benchmarks/RESULTS.md), so it switches
nothing off, except in runs recorded before controls judged the screen (``[model] judge = "kept"``).
It never judges: the gate reads real validation episodes only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["HORIZON_CAP", "MIN_CORRELATION", "WINDOW", "ScreenState", "choose", "horizon_for", "optimistic",
           "rank_correlation"]

#: ``[model] min_correlation``'s default, here and in the spec: below chance the screen switches itself off.
MIN_CORRELATION = 0.0
#: ``[model] window``'s default, here and in the spec (generations judged before it may switch off).
WINDOW = 4
#: The longest imagined episode when ``[model] horizon`` is not set (env steps).
HORIZON_CAP = 1000


def horizon_for(step_limit: int | None) -> int:
    """The imagined horizon when ``[model] horizon`` is not set: the task's episode step limit (None: none),
    at most :data:`HORIZON_CAP` env steps (an imagined step costs one ``act`` call per start state and member)."""
    return HORIZON_CAP if step_limit is None else max(1, min(int(step_limit), HORIZON_CAP))


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
        min_correlation: Below this it switches off: its advantage over the controls (``judge = "controls"``), or
            the mean rank correlation of the last ``window`` judged generations (``judge = "kept"``).
        window: Generations it is judged over before it may switch off (with controls: generations that ran some).
        judge: ``"controls"`` (its kept candidates against the controls; without controls it stays on) or
            ``"kept"`` (the rank correlation among what ran: runs recorded before controls judged it).
        on: Whether it still chooses what is run.
        correlations: Per judged generation, the rank correlation (None where it said nothing).
        saved: Proposals screened out (not run) so far.
        switched_off_at: The generation it switched off after, or None.
        wins: Kept-versus-control pairs the kept candidate won so far (a tie counts half).
        pairs: Kept-versus-control pairs so far.
        controlled: Generations with at least one such pair.
    """

    min_correlation: float = MIN_CORRELATION
    window: int = WINDOW
    judge: str = "controls"
    on: bool = True
    correlations: list[float | None] = field(default_factory=list)
    saved: int = 0
    switched_off_at: int | None = None
    wins: float = 0.0
    pairs: int = 0
    controlled: int = 0

    def advantage(self) -> float | None:
        """``(wins - losses) / pairs`` over the kept-versus-control pairs so far (-1 to 1; 0: no better than a
        random pick), or None before any."""
        return None if not self.pairs else (2.0 * self.wins - self.pairs) / self.pairs

    def judge_generation(self, generation: int, rho: float | None, kept: Sequence[float],
                         controls: Sequence[float]) -> bool:
        """Take one screened generation in: the rank correlation among what ran (``rho``) and the real training
        means of the candidates it kept (its best-ranked) and of the controls. Switches off per :attr:`judge`.
        Returns whether the screen is still on."""
        if self.judge == "kept":
            return self._judge_by_correlation(generation, rho)
        self.correlations.append(rho)
        k, c = np.asarray(kept, np.float64)[:, None], np.asarray(controls, np.float64)[None, :]
        if k.size and c.size:
            self.wins += float((k > c).sum() + 0.5 * (k == c).sum())
            self.pairs += int(k.size * c.size)
            self.controlled += 1
        adv = self.advantage()
        if self.on and self.controlled >= self.window and adv is not None and adv < self.min_correlation:
            self.on, self.switched_off_at = False, generation
        return self.on

    def _judge_by_correlation(self, generation: int, rho: float | None) -> bool:
        """The rule of ``judge = "kept"``: off when the last ``window`` correlations that said something average
        below ``min_correlation``."""
        self.correlations.append(rho)
        seen = [r for r in self.correlations if r is not None][-self.window:]
        if self.on and len(seen) >= self.window and float(np.mean(seen)) < self.min_correlation:
            self.on, self.switched_off_at = False, generation
        return self.on
