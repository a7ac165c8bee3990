"""Evaluations (a candidate's episodes on one split, with statistics) and critiques."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ratchet.rollout import Episode

__all__ = ["Critic", "Critique", "Evaluation", "FailureMode", "by_opponent", "error_mode", "is_failure", "merged_modes", "seedless"]


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
        """Env steps these episodes took (attempts lost and run again included: :attr:`Episode.env_steps`)."""
        return sum(e.env_steps for e in self.episodes)

    def summary(self) -> dict[str, Any]:
        """``{mean, std, n, success_rate, n_errors, env_steps}`` (JSON-ready)."""
        return {"mean": self.mean, "std": self.std, "n": self.n, "success_rate": self.success_rate,
                "n_errors": self.n_errors, "env_steps": self.env_steps}


@dataclass(frozen=True)
class FailureMode:
    """One group of failing episodes.

    Attributes:
        label: The cause (a diagnoser label, ``error: …``, or ``cluster k``).
        count: Failing episodes in the group.
        share: ``count`` over all episodes of the evaluation, in [0, 1].
        mean_return: Mean return of the group's episodes.
        example_seeds: Up to three seeds of the group, lowest return first.
        description: For clusters, the final-state features that set the group apart, e.g.
            ``"vy low (−2.1σ), angle high (+1.4σ)"`` (σ: standard deviation over all episodes).
    """

    label: str
    count: int
    share: float
    mean_return: float
    example_seeds: tuple[int, ...]
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"label": self.label, "count": self.count, "share": self.share, "mean_return": self.mean_return,
                "example_seeds": list(self.example_seeds), "description": self.description}


@dataclass(frozen=True)
class Critique:
    """What went wrong in an evaluation, for a person or a refiner.

    Attributes:
        candidate_id: The candidate critiqued.
        split: The split its evaluation covers.
        stats: :meth:`Evaluation.summary` of the evaluation.
        mean_ci: 95 % bootstrap interval of the mean return (``scipy.stats.bootstrap``, BCa), or None
            for fewer than 2 episodes.
        success_ci: 95 % Wilson interval of the success rate, or None when the task has no success.
        failure_modes: Failing episodes (errored, or unsuccessful where the task defines success)
            grouped by cause, largest group first.
        errors: Error reason (first 80 chars, seeds written ``seed N``: :func:`seedless`) -> count.
        worst_seeds: Up to 5 ``(seed, return)`` pairs, lowest return first.
        regressions: Seeds where the candidate is worse than the incumbent by more than the tolerance,
            as ``(seed, candidate_return, incumbent_return)``.
        new_failures: Seeds the incumbent succeeds on and the candidate fails.
        text: A short markdown rendering.
        traces: The last steps of some of its worst episodes, replayed on the trusted side
            (:class:`ratchet.trace.Trace`; empty unless a refiner asked for them, see
            :class:`~ratchet.refiners.registry.RefinerContext` ``critique``).
        opponents: A game's payoff row (:func:`by_opponent`): per opponent met, the episodes, mean payoff,
            wins / draws / losses and the compared policy's mean on the same episodes, worst first; empty for
            tasks without opponents.
    """

    candidate_id: str
    split: str
    stats: dict[str, Any]
    errors: dict[str, int] = field(default_factory=dict)
    worst_seeds: list[tuple[int, float]] = field(default_factory=list)
    regressions: list[tuple[int, float, float]] = field(default_factory=list)
    text: str = ""
    mean_ci: tuple[float, float] | None = None
    success_ci: tuple[float, float] | None = None
    failure_modes: list[FailureMode] = field(default_factory=list)
    new_failures: list[int] = field(default_factory=list)
    traces: tuple[Any, ...] = ()
    opponents: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (stored in the ledger); ``traces`` only when there are some."""
        return {"candidate_id": self.candidate_id, "split": self.split, "stats": self.stats,
                "mean_ci": list(self.mean_ci) if self.mean_ci else None,
                "success_ci": list(self.success_ci) if self.success_ci else None,
                "failure_modes": [m.to_dict() for m in self.failure_modes], "errors": self.errors,
                "worst_seeds": [list(w) for w in self.worst_seeds],
                "regressions": [list(r) for r in self.regressions], "new_failures": self.new_failures,
                "text": self.text, **({"traces": [t.to_dict() for t in self.traces]} if self.traces else {}),
                **({"opponents": self.opponents} if self.opponents else {})}


def seedless(error: str) -> str:
    """An episode's error text (a ``str``) on one line with each seed in it written ``seed N``: the same failure
    reads the same whatever episode it names (``"skipped: timeout after 3 s on seed 1217899928"`` -> ``"skipped:
    timeout after 3 s on seed N"``), so errors and failure modes group by it."""
    import re

    return re.sub(r"\bseed(\s*[=:]?\s*)-?\d+", r"seed\1N", " ".join(error.split()))


def error_mode(error: str) -> str:
    """The failure-mode label of an episode's error: ``"error: "`` and the first 60 characters of
    :func:`seedless` of it."""
    return "error: " + seedless(error)[:60]


def merged_modes(modes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Failure modes as stored (:meth:`FailureMode.to_dict`) with those whose labels differ only in a seed
    (:func:`seedless`) merged into one: counts and shares added, mean returns weighted by count, the first three
    example seeds, the first description; largest first, as :meth:`Critic.failure_modes` orders them."""
    merged: dict[str, dict[str, Any]] = {}
    for m in modes:
        label = seedless(str(m["label"]))
        if label not in merged:
            merged[label] = {**m, "label": label, "example_seeds": list(m["example_seeds"])}
            continue
        into = merged[label]
        a, b = int(into["count"]), int(m["count"])
        into["mean_return"] = (a * float(into["mean_return"]) + b * float(m["mean_return"])) / (a + b)
        into["count"], into["share"] = a + b, float(into["share"]) + float(m["share"])
        into["example_seeds"] = (into["example_seeds"] + list(m["example_seeds"]))[:3]
    return sorted(merged.values(), key=lambda m: (-m["count"], m["label"]))


def is_failure(ep: Episode) -> bool:
    """An episode fails when it errored, where the task defines success did not succeed, or its task labelled
    how it failed (an evaluator's ``failure``)."""
    return ep.error is not None or ep.success is False or bool(ep.diagnostics.get("failure"))


class Critic:
    """Turns evaluations into critiques: intervals, failure modes, regressions, a readable text.

    Failing episodes are grouped by ``diagnose(episode)[0]`` when a diagnoser is given (see
    :mod:`ratchet.diagnosers`). Otherwise errored episodes are grouped by error text, and the other
    failing episodes by how they ended (a time-out, :attr:`~ratchet.rollout.Episode.timed_out`; or an end below
    the success threshold, also on the time limit's last step: a goal reached too slowly is not a crash); each of
    those groups is clustered on its final observation with k-means (scikit-learn; k in 2..4 chosen by silhouette
    score, one group when no clustering scores above 0.25); each cluster is described by the two features whose cluster mean stands furthest, in
    standard deviations, from the evaluation's mean.

    Args:
        diagnose: Optional diagnoser ``Episode -> list[str]``.
        observation_names: Names for final-observation features in cluster descriptions: a list, or
            a function of the observation size returning one.
        regression_tolerance: A seed is a regression when the candidate's return is lower than the
            incumbent's by more than this (return units).
        n_resamples: Bootstrap resamples for the mean's interval.
        seed: Seed for the bootstrap and k-means (critiques are deterministic).
        success_rule: How the task decides success, in words with the threshold's source
            (:meth:`ratchet.task.GymTask.success_rule`), shown beside every success rate.
        episode_unit: What the task calls its episodes (:attr:`ratchet.tasks.Task.episode_unit`): an evaluator's
            ``"instances"`` are critiqued as instances with a score, and with no Gymnasium endings (every scored
            instance "terminated").
        return_name: What it calls an episode's return (``"score"``).
    """

    def __init__(self, diagnose: Any = None, observation_names: Sequence[str] | Any = None,
                 regression_tolerance: float = 0.0, n_resamples: int = 2000, seed: int = 0,
                 success_rule: str | None = None, episode_unit: str = "episodes", return_name: str = "return") -> None:
        self.success_rule = success_rule
        self.episode_unit, self.return_name = episode_unit, return_name
        self.diagnose = diagnose
        self.observation_names = observation_names
        self.regression_tolerance = regression_tolerance
        self.n_resamples = n_resamples
        self.seed = seed

    @classmethod
    def for_task(cls, task: Any, **kwargs: Any) -> Critic:
        """A critic using a :class:`~ratchet.tasks.Task`'s diagnoser, observation names and success rule (each None
        where the task defines none), and its words for episodes and returns."""
        return cls(task.diagnose, task.observation_names, success_rule=task.success_rule(),
                   episode_unit=task.episode_unit, return_name=task.return_name, **kwargs)

    def critique(self, evaluation: Evaluation, incumbent: Evaluation | None = None) -> Critique:
        """Critique ``evaluation``, comparing seed by seed with ``incumbent`` when given."""
        eps = evaluation.episodes
        errors = Counter(seedless(e.error)[:80] for e in eps if e.error)
        worst = sorted(((e.seed, e.episode_return) for e in eps), key=lambda t: t[1])[:5]
        regressions: list[tuple[int, float, float]] = []
        new_failures: list[int] = []
        if incumbent is not None:
            inc = {e.seed: e for e in incumbent.episodes}
            regressions = [(e.seed, e.episode_return, inc[e.seed].episode_return) for e in eps
                           if e.seed in inc and e.episode_return < inc[e.seed].episode_return - self.regression_tolerance]
            new_failures = [e.seed for e in eps if e.seed in inc and is_failure(e) and inc[e.seed].success is True]
        stats = evaluation.summary()
        mean_ci = self._mean_ci(evaluation.returns)
        success_ci = self._success_ci(evaluation)
        modes = self.failure_modes(evaluation)
        opponents = by_opponent(evaluation, incumbent)
        text = _render(evaluation, stats, mean_ci, success_ci, modes, errors, worst,
                       regressions if incumbent is not None else None, new_failures, self.success_rule, opponents,
                       (self.episode_unit, self.return_name))
        return Critique(evaluation.candidate_id, evaluation.split, stats, dict(errors), worst, regressions, text,
                        mean_ci, success_ci, modes, new_failures, opponents=opponents)

    def _mean_ci(self, returns: np.ndarray) -> tuple[float, float] | None:
        if len(returns) < 2:
            return None
        if np.all(returns == returns[0]):
            return (float(returns[0]), float(returns[0]))
        from scipy.stats import bootstrap

        res = bootstrap((returns,), np.mean, confidence_level=0.95, n_resamples=self.n_resamples,
                        method="BCa", random_state=np.random.default_rng(self.seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if not (np.isfinite(lo) and np.isfinite(hi)):  # BCa can fail on degenerate samples
            lo, hi = (float(x) for x in np.percentile(returns, [2.5, 97.5]))
        return (lo, hi)

    @staticmethod
    def _success_ci(evaluation: Evaluation) -> tuple[float, float] | None:
        rate = evaluation.success_rate
        if rate is None or evaluation.n == 0:
            return None
        from scipy.stats import binomtest

        k = round(rate * evaluation.n)
        ci = binomtest(k, evaluation.n).proportion_ci(confidence_level=0.95, method="wilson")
        return (float(ci.low), float(ci.high))

    def failure_modes(self, evaluation: Evaluation) -> list[FailureMode]:
        """Group the evaluation's failing episodes by cause (see the class docstring)."""
        eps = evaluation.episodes
        failing = [e for e in eps if is_failure(e)]
        if not failing:
            return []
        groups: dict[str, list[Episode]] = {}
        descriptions: dict[str, str] = {}
        if self.diagnose is not None:
            for e in failing:
                labels = self.diagnose(e) or ["unknown"]
                groups.setdefault(labels[0], []).append(e)
            for label, members in groups.items():  # the task's own words for its worst member (an evaluator's text)
                worst = min(members, key=lambda e: e.episode_return)
                if isinstance(worst.diagnostics.get("text"), str):
                    descriptions[label] = worst.diagnostics["text"]
        else:
            for e in failing:
                if e.error:
                    groups.setdefault(error_mode(e.error), []).append(e)
            for ending in ("time-out", "ended below the success threshold"):
                rest = [e for e in failing if not e.error and e.timed_out == (ending == "time-out")]
                for label, members, desc in self._clusters(rest, eps) if rest else []:
                    label = ending if label == "failed" else f"{ending}, {label}"
                    groups[label] = members
                    descriptions[label] = desc
        n = len(eps)
        modes = []
        for label, members in groups.items():
            members = sorted(members, key=lambda e: e.episode_return)
            modes.append(FailureMode(label, len(members), len(members) / n,
                                     float(np.mean([e.episode_return for e in members])),
                                     tuple(e.seed for e in members[:3]), descriptions.get(label, "")))
        return sorted(modes, key=lambda m: (-m.count, m.label))

    def _clusters(self, failing: list[Episode], all_eps: Sequence[Episode]) -> list[tuple[str, list[Episode], str]]:
        feats = [e.diagnostics.get("final_observation") for e in failing]
        sizes = {len(f) for f in feats if f}
        if None in feats or len(sizes) != 1 or len(failing) < 6:
            return [("failed", failing, "")]
        X = np.array(feats, dtype=np.float64)
        ref = np.array([e.diagnostics["final_observation"] for e in all_eps
                        if e.diagnostics.get("final_observation") and len(e.diagnostics["final_observation"]) == X.shape[1]])
        mu, sd = ref.mean(axis=0), ref.std(axis=0)
        sd[sd == 0] = 1.0
        Z = (X - mu) / sd
        from sklearn.cluster import KMeans
        from sklearn.metrics import silhouette_score
        from threadpoolctl import threadpool_limits  # scikit-learn brings it

        best_k, best_score, best_labels = 1, 0.25, np.zeros(len(failing), dtype=int)
        distinct = len(np.unique(np.round(Z, 9), axis=0))
        # a few dozen points: OpenMP/BLAS threads only spin, against the run's own workers (5-10x slower on a busy
        # 2-core machine, and every worker idle meanwhile; the labels are the same with one thread)
        with threadpool_limits(1):
            for k in range(2, min(4, len(failing) // 3, distinct) + 1):
                labels = KMeans(n_clusters=k, n_init=10, random_state=self.seed).fit_predict(Z)
                if len(set(labels)) < 2:
                    continue
                score = silhouette_score(Z, labels)
                if score > best_score:
                    best_k, best_score, best_labels = k, score, labels
        names = self.observation_names(X.shape[1]) if callable(self.observation_names) else self.observation_names
        if not names or len(names) != X.shape[1]:
            names = [f"obs[{i}]" for i in range(X.shape[1])]
        out = []
        for c in range(best_k):
            members = [e for e, lab in zip(failing, best_labels) if lab == c]
            zc = Z[best_labels == c].mean(axis=0)
            top = np.argsort(-np.abs(zc))[:2]
            desc = ", ".join(f"{names[i]} {'high' if zc[i] > 0 else 'low'} ({zc[i]:+.1f}σ)" for i in top)
            out.append((f"cluster {c + 1}" if best_k > 1 else "failed", members, desc))
        return out


#: What to do when a task defines no success (no threshold given, none registered for the env or the evaluator).
NO_SUCCESS_HINT = ("the task defines no success (no reward threshold registered for the env, no SUCCESS in the "
                   "evaluator); set [task] success_threshold to a return")


def by_opponent(evaluation: Evaluation, compared: Evaluation | None = None) -> list[dict[str, Any]]:
    """A game's payoff row: the evaluation's episodes grouped by ``diagnostics["opponent"]``, worst mean first.

    Returns:
        One dict per opponent: ``opponent``, ``n`` (episodes), ``mean`` (payoff), ``wins``, ``draws``, ``losses``
        (by payoff sign; an errored episode is a loss), and ``compared_mean``, the mean of ``compared`` on the same
        seeds (None without it). Empty when no episode names an opponent.
    """
    other = {e.seed: e.episode_return for e in compared.episodes} if compared is not None else {}
    groups: dict[str, list[Episode]] = {}
    for e in evaluation.episodes:
        if e.diagnostics.get("opponent") is not None:
            groups.setdefault(str(e.diagnostics["opponent"]), []).append(e)
    rows = []
    for name, eps in groups.items():
        paired = [other[e.seed] for e in eps if e.seed in other]
        r = np.array([e.episode_return for e in eps], dtype=np.float64)
        rows.append({"opponent": name, "n": len(eps), "mean": float(r.mean()),
                     "wins": int(sum(e.error is None and e.episode_return > 0 for e in eps)),
                     "draws": int(sum(e.error is None and e.episode_return == 0 for e in eps)),
                     "losses": int(sum(e.error is not None or e.episode_return < 0 for e in eps)),
                     "compared_mean": float(np.mean(paired)) if paired and len(paired) == len(eps) else None})
    return sorted(rows, key=lambda row: (row["mean"], row["opponent"]))


def _render(evaluation: Evaluation, stats: dict[str, Any], mean_ci: tuple[float, float] | None,
            success_ci: tuple[float, float] | None, modes: list[FailureMode], errors: Counter,
            worst: list[tuple[int, float]], regressions: list[tuple[int, float, float]] | None,
            new_failures: list[int], success_rule: str | None = None,
            opponents: Sequence[Mapping[str, Any]] = (), words: tuple[str, str] = ("episodes", "return")) -> str:
    unit, ret = words  # the task's: ("episodes", "return"), an evaluator's ("instances", "score")
    ci = f" (95 % CI {mean_ci[0]:.2f} to {mean_ci[1]:.2f})" if mean_ci else ""
    lines = [f"### Candidate {evaluation.candidate_id} on {evaluation.split} ({stats['n']} {unit})",
             f"- mean {ret} {stats['mean']:.2f}{ci}, std {stats['std']:.2f}"]
    if stats["success_rate"] is not None:
        sci = f" (95 % CI {100 * success_ci[0]:.1f}–{100 * success_ci[1]:.1f} %)" if success_ci else ""
        rule = f"; success: {success_rule}" if success_rule else ""
        lines.append(f"- success rate {100 * stats['success_rate']:.1f} %{sci}{rule}")
    elif not errors:
        lines.append(f"- success is undefined for this task ({NO_SUCCESS_HINT}), so only errored {unit} (and "
                     f"{unit} the task labels as failed) count as failures")
    eps = evaluation.episodes
    if eps and unit != "episodes":  # instances end scored or errored: no Gymnasium endings to tell apart
        lines.append(f"- {sum(e.error is None for e in eps)} scored, {sum(e.error is not None for e in eps)} errored")
    elif eps:  # how episodes ended, apart from success: fewer time-outs can come with a lower success rate
        both = sum(e.terminated and e.truncated for e in eps)  # Gymnasium sets both when it ends on the last step
        lines.append(f"- endings: {sum(e.terminated for e in eps)} terminated, {sum(e.truncated for e in eps)} "
                     f"time-outs (truncated{f'; {both} of them also terminated, on the last step' if both else ''}), "
                     f"{sum(e.error is not None for e in eps)} errored")
    if modes:
        lines.append(f"- failure modes (errored or unsuccessful {unit}):" if stats["success_rate"] is not None
                     else "- failure modes:")
        for m in modes:
            desc = f" — {m.description}" if m.description else ""
            lines.append(f"  - **{m.label}**: {m.count} {unit if m.count != 1 else unit[:-1]} ({100 * m.share:.1f} %), mean {ret} "
                         f"{m.mean_return:.1f}, e.g. seeds {', '.join(map(str, m.example_seeds))}{desc}")
    if opponents:
        lines.append("- by opponent (worst first): " + "; ".join(
            f"{o['opponent']} {o['mean']:+.2f} ({o['wins']} W / {o['draws']} D / {o['losses']} L of {o['n']}"
            + (f"; compared {o['compared_mean']:+.2f}" if o["compared_mean"] is not None else "") + ")"
            for o in opponents))
    if errors:
        lines.append("- errors: " + "; ".join(f"{n}× {r}" for r, n in errors.most_common(3)))
    if worst:
        lines.append("- worst seeds: " + ", ".join(f"{s} ({r:.1f})" for s, r in worst))
    if regressions is not None:
        lines.append(f"- regressions against the compared policy: {len(regressions)} of {len(evaluation.episodes)} "
                     f"seeds worse, {len(new_failures)} newly failing")
    return "\n".join(lines)


def evaluation_from_episodes(candidate_id: str, split: str, episodes: Sequence[Episode]) -> Evaluation:
    """Convenience constructor."""
    return Evaluation(candidate_id, split, tuple(episodes))
