"""The gate: a candidate replaces the incumbent only if a paired test on validation seeds says so."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
from scipy import stats

from ratchet.critic import Evaluation

__all__ = ["Decision", "Gate", "PairedTestGate", "spending_level"]


@dataclass(frozen=True)
class Decision:
    """The gate's verdict on one candidate.

    Attributes:
        candidate_id: Candidate tested.
        incumbent_id: Incumbent it was compared with.
        promoted: Whether the candidate becomes the incumbent.
        p_value: One-sided p-value for "candidate better" (1.0 when not computed).
        mean_diff: Mean paired difference candidate − incumbent (return units).
        n: Number of paired validation seeds.
        test: Test used (``"t"`` or ``"wilcoxon"``).
        alpha: Significance level used for this decision (after alpha spending).
        contested: Whether the mean difference was positive (only such decisions spend alpha).
        reason: One line explaining the verdict.
    """

    candidate_id: str
    incumbent_id: str
    promoted: bool
    p_value: float
    mean_diff: float
    n: int
    test: str
    alpha: float
    reason: str
    contested: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class Gate(Protocol):
    """Decides promotions from validation evaluations only."""

    def decide(self, candidate: Evaluation, incumbent: Evaluation, k: int = 1) -> Decision:
        """Compare two evaluations on the same validation seeds as the run's ``k``-th decision."""


def spending_level(alpha: float, k: int, spending: str) -> float:
    """Significance level of the run's ``k``-th *contested* gate decision (1-based).

    A decision is contested when the candidate's mean paired difference on validation is positive;
    a candidate that does worse than the incumbent on validation cannot be promoted at any level, so
    it spends nothing.

    ``"harmonic"``: ``alpha / (2 k (k + 1))``. The levels sum to ``alpha / 2``; under the null a
    decision is contested with probability about 1/2 (a symmetric paired difference), so the
    expected number of decisions up to and including the k-th contested one is at most 2 per
    contested decision, and the union bound gives a run-wide chance of any false promotion of at
    most ``2 · alpha / 2 = alpha``, however often the run gates.
    ``"none"``: ``alpha`` for every decision (each decision alone is a level-``alpha`` test).
    """
    if spending == "none":
        return alpha
    return alpha / (2 * k * (k + 1))


class PairedTestGate:
    """One-sided paired test over the validation seeds, with alpha spending across decisions.

    Promotes when the candidate has no errored episode, its mean paired difference exceeds
    ``min_improvement``, it does not newly fail too many of the seeds the incumbent succeeds on
    (``max_new_failures``), and the one-sided p-value is below this decision's level. With
    ``test="t"`` the p-value is the paired t-test's (``scipy.stats.ttest_1samp`` on the differences,
    ``alternative="greater"``); with ``"wilcoxon"`` the Wilcoxon signed-rank test's
    (``scipy.stats.wilcoxon``). When every paired difference is equal (for example all episodes at
    the time limit) the t statistic is undefined: equal positive differences give p = 0, zero
    differences give p = 1.

    Why alpha spending: a run tests many candidates against one fixed validation set; at a constant
    level α each decision has an α chance of promoting noise, so a run with 20 gates would promote
    noise far more often than α. With ``spending="harmonic"`` (default) the k-th contested decision
    (positive mean difference) uses ``alpha / (2 k (k + 1))`` (see :func:`spending_level`), which
    keeps the chance of any false promotion in a whole run at most α (union bound; the decision to
    gate may depend on training data and on the incumbent's validation scores without breaking
    this, since each test is valid whatever led to it). The price is power late in a run: later
    candidates need stronger evidence, so tasks with noisy returns need more validation episodes.
    Refreshing validation seeds would not remove the multiplicity; an anytime-valid test would, but
    needs more episodes per decision.

    Because a promoted candidate always has a higher validation mean than the incumbent, the
    incumbent's validation mean never goes down.

    Args:
        alpha: Family-wise significance level in (0, 1).
        test: ``"t"`` (default) or ``"wilcoxon"`` (rank based: more power on heavy-tailed returns, but it
            tests a shift of the typical episode rather than of the mean).
        min_improvement: Minimum mean paired difference (return units) to promote.
        spending: ``"harmonic"`` or ``"none"``.
        max_new_failures: Regression obligation: reject when the candidate fails more than this share
            (0–1) of the validation seeds on which the incumbent succeeds, whatever its mean. None
            disables the check.

    Raises:
        ValueError: bad ``alpha``, ``test``, ``spending`` or ``max_new_failures``.
    """

    def __init__(self, alpha: float = 0.05, test: str = "t", min_improvement: float = 0.0,
                 spending: str = "harmonic", max_new_failures: float | None = None) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if test not in ("t", "wilcoxon"):
            raise ValueError(f"test must be \"t\" or \"wilcoxon\", got {test!r}")
        if spending not in ("harmonic", "none"):
            raise ValueError(f"spending must be \"harmonic\" or \"none\", got {spending!r}")
        if max_new_failures is not None and not 0.0 <= max_new_failures <= 1.0:
            raise ValueError(f"max_new_failures must be in [0, 1], got {max_new_failures}")
        self.alpha, self.test, self.min_improvement = alpha, test, min_improvement
        self.spending, self.max_new_failures = spending, max_new_failures

    def decide(self, candidate: Evaluation, incumbent: Evaluation, k: int = 1) -> Decision:
        """Decide on ``candidate``; if contested (positive mean difference) it is the run's ``k``-th
        contested decision (1-based), which sets its level. The caller counts contested decisions:
        :attr:`Decision.contested`.

        Raises:
            ValueError: the two evaluations do not cover the same seeds, or ``k < 1``.
        """
        if candidate.seeds != incumbent.seeds:
            raise ValueError("candidate and incumbent must be evaluated on the same validation seeds")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        n = candidate.n
        level = spending_level(self.alpha, k, self.spending)

        def verdict(promoted: bool, p: float, diff: float, reason: str) -> Decision:
            return Decision(candidate.candidate_id, incumbent.candidate_id, promoted, p, diff, n, self.test,
                            level, reason, bool(diff > 0))

        if candidate.n_errors:
            return verdict(False, 1.0, float("nan"), f"{candidate.n_errors} validation episode(s) failed with an error")
        d = candidate.returns - incumbent.returns
        diff = float(d.mean())
        p = self._p_value(d)
        if diff <= self.min_improvement:
            return verdict(False, p, diff, f"mean difference {diff:+.3f} not above {self.min_improvement:g}")
        if self.max_new_failures is not None:
            held = [c.success is not True for c, i in zip(candidate.episodes, incumbent.episodes) if i.success is True]
            if held and sum(held) / len(held) > self.max_new_failures:
                return verdict(False, p, diff, f"newly fails {sum(held)} of {len(held)} validation seeds the incumbent "
                                               f"succeeds on (more than {100 * self.max_new_failures:g} %)")
        if p >= level:
            return verdict(False, p, diff, f"not significant: p = {p:.4g} ≥ α_{k} = {level:.4g}")
        return verdict(True, p, diff, f"better by {diff:+.3f} (p = {p:.2g} < α_{k} = {level:.4g})")

    def _p_value(self, d: np.ndarray) -> float:
        if len(d) < 2:
            return 1.0
        if np.all(d == d[0]):
            return 0.0 if d[0] > 0 else 1.0
        if self.test == "wilcoxon":
            if not np.any(d != 0):
                return 1.0
            p = stats.wilcoxon(d, alternative="greater", zero_method="zsplit").pvalue
        else:
            p = stats.ttest_1samp(d, 0.0, alternative="greater").pvalue
        return float(p) if math.isfinite(p) else 1.0
