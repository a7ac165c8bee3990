"""Evaluations (a candidate's episodes on one split, with statistics) and critiques."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ratchet.rollout import Episode

__all__ = ["Evaluation", "Critique", "Critic"]


@dataclass(frozen=True)
class Evaluation:
    """The episodes of one candidate on one split.

    Attributes:
        candidate_id: The candidate evaluated.
        split: ``"train"``, ``"validation"`` or ``"test"``.
        episodes: One :class:`Episode` per seed, in seed-list order.
    """

    candidate_id: str
    split: str
    episodes: tuple[Episode, ...]

    @property
    def seeds(self) -> list[int]:
        """Episode seeds, in order."""
        return [e.seed for e in self.episodes]

    @property
    def returns(self) -> np.ndarray:
        """Episode returns, float64, shape ``(n,)``."""
        return np.array([e.episode_return for e in self.episodes], dtype=np.float64)

    @property
    def n(self) -> int:
        """Number of episodes."""
        return len(self.episodes)

    @property
    def mean(self) -> float:
        """Mean episode return (NaN when empty)."""
        return float(self.returns.mean()) if self.episodes else float("nan")

    @property
    def std(self) -> float:
        """Population standard deviation of returns (ddof=0), as RL papers report."""
        return float(self.returns.std()) if self.episodes else float("nan")

    @property
    def n_errors(self) -> int:
        """Episodes that ended in an error (exception, invalid action, timeout, crash)."""
        return sum(e.error is not None for e in self.episodes)

    @property
    def success_rate(self) -> float | None:
        """Share of successful episodes (errored ones count as failures); None when the task defines no success."""
        if not any(e.success is not None for e in self.episodes):
            return None  # the task defines no success (or nothing ran)
        return float(np.mean([e.success is True for e in self.episodes]))

    @property
    def env_steps(self) -> int:
        """Env steps these episodes took."""
        return sum(e.length for e in self.episodes)

    def summary(self) -> dict[str, Any]:
        """``{mean, std, n, success_rate, n_errors, env_steps}`` (JSON-ready)."""
        return {"mean": self.mean, "std": self.std, "n": self.n, "success_rate": self.success_rate,
                "n_errors": self.n_errors, "env_steps": self.env_steps}


@dataclass(frozen=True)
class Critique:
    """What went wrong in an evaluation, for a person or a refiner.

    Attributes:
        candidate_id: The candidate critiqued.
        split: The split its evaluation covers.
        stats: :meth:`Evaluation.summary` of the evaluation.
        errors: Error reason (first 80 chars) -> count.
        worst_seeds: Up to 5 ``(seed, return)`` pairs, lowest return first.
        regressions: Seeds where the candidate is worse than the incumbent by more than the tolerance,
            as ``(seed, candidate_return, incumbent_return)``.
        text: A short markdown rendering.
    """

    candidate_id: str
    split: str
    stats: dict[str, Any]
    errors: dict[str, int] = field(default_factory=dict)
    worst_seeds: list[tuple[int, float]] = field(default_factory=list)
    regressions: list[tuple[int, float, float]] = field(default_factory=list)
    text: str = ""


class Critic:
    """Turns evaluations into critiques.

    Args:
        regression_tolerance: A seed counts as a regression when the candidate's return is lower
            than the incumbent's by more than this (return units).
    """

    def __init__(self, regression_tolerance: float = 0.0) -> None:
        self.regression_tolerance = regression_tolerance

    def critique(self, evaluation: Evaluation, incumbent: Evaluation | None = None) -> Critique:
        """Critique ``evaluation``, comparing seed by seed with ``incumbent`` when given."""
        eps = evaluation.episodes
        errors = Counter((e.error or "")[:80] for e in eps if e.error)
        worst = sorted(((e.seed, e.episode_return) for e in eps), key=lambda t: t[1])[:5]
        regressions: list[tuple[int, float, float]] = []
        if incumbent is not None:
            inc = {e.seed: e.episode_return for e in incumbent.episodes}
            regressions = [(e.seed, e.episode_return, inc[e.seed]) for e in eps
                           if e.seed in inc and e.episode_return < inc[e.seed] - self.regression_tolerance]
        stats = evaluation.summary()
        lines = [f"### Candidate {evaluation.candidate_id} on {evaluation.split} ({stats['n']} episodes)",
                 f"- mean return {stats['mean']:.2f} ± {stats['std']:.2f} (std)"]
        if stats["success_rate"] is not None:
            lines.append(f"- success rate {100 * stats['success_rate']:.1f} %")
        if errors:
            lines.append("- errors: " + "; ".join(f"{n}× {r}" for r, n in errors.most_common(3)))
        if worst:
            lines.append("- worst seeds: " + ", ".join(f"{s} ({r:.1f})" for s, r in worst))
        if incumbent is not None:
            lines.append(f"- regressions vs incumbent: {len(regressions)} of {len(eps)} seeds")
        return Critique(evaluation.candidate_id, evaluation.split, stats, dict(errors), worst, regressions,
                        "\n".join(lines))


def evaluation_from_episodes(candidate_id: str, split: str, episodes: Sequence[Episode]) -> Evaluation:
    """Convenience constructor."""
    return Evaluation(candidate_id, split, tuple(episodes))
