"""The gate: a candidate replaces the incumbent only if a paired test on validation seeds says so."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
from scipy import stats

from ratchet.critic import Evaluation

__all__ = ["Decision", "Gate", "PairedTestGate"]


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
        alpha: Significance level used.
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class Gate(Protocol):
    """Decides promotions from validation evaluations only."""

    def decide(self, candidate: Evaluation, incumbent: Evaluation) -> Decision:
        """Compare two evaluations on the same validation seeds."""


class PairedTestGate:
    """One-sided paired test over the validation seeds.

    Promotes when the candidate has no errored episode, its mean paired difference exceeds
    ``min_improvement``, and the one-sided p-value is below ``alpha``. With ``test="t"`` this is the
    paired t-test (``scipy.stats.ttest_rel``, ``alternative="greater"``); with ``"wilcoxon"`` the
    Wilcoxon signed-rank test (``scipy.stats.wilcoxon``). When every paired difference is equal (for
    example all episodes at the time limit) the t statistic is undefined: equal positive differences
    give p = 0, zero differences give p = 1.

    Because a promoted candidate always has a higher validation mean than the incumbent, the
    incumbent's validation mean never goes down.

    Args:
        alpha: Significance level in (0, 1).
        test: ``"t"`` or ``"wilcoxon"``.
        min_improvement: Minimum mean paired difference (return units) to promote.

    Raises:
        ValueError: bad ``alpha`` or ``test``.
    """

    def __init__(self, alpha: float = 0.05, test: str = "t", min_improvement: float = 0.0) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if test not in ("t", "wilcoxon"):
            raise ValueError(f"test must be \"t\" or \"wilcoxon\", got {test!r}")
        self.alpha, self.test, self.min_improvement = alpha, test, min_improvement

    def decide(self, candidate: Evaluation, incumbent: Evaluation) -> Decision:
        """See class docstring.

        Raises:
            ValueError: the two evaluations do not cover the same seeds.
        """
        if candidate.seeds != incumbent.seeds:
            raise ValueError("candidate and incumbent must be evaluated on the same validation seeds")
        n = candidate.n

        def verdict(promoted: bool, p: float, diff: float, reason: str) -> Decision:
            return Decision(candidate.candidate_id, incumbent.candidate_id, promoted, p, diff, n, self.test,
                            self.alpha, reason)

        if candidate.n_errors:
            return verdict(False, 1.0, float("nan"), f"{candidate.n_errors} validation episode(s) failed with an error")
        d = candidate.returns - incumbent.returns
        diff = float(d.mean())
        p = self._p_value(d)
        if diff <= self.min_improvement:
            return verdict(False, p, diff, f"mean difference {diff:+.3f} not above {self.min_improvement:g}")
        if p >= self.alpha:
            return verdict(False, p, diff, f"not significant: p = {p:.4f} ≥ α = {self.alpha:g}")
        return verdict(True, p, diff, f"better by {diff:+.3f} (p = {p:.2g} < α = {self.alpha:g})")

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
