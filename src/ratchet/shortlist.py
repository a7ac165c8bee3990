"""The shortlist: the best candidates a run's search has seen so far, and when one is worth certifying.

With ``[planner] decide = "powered"`` the loop does not send each generation's best to the gate. It keeps every
clean candidate's training result here, ranks them by a *shrunken* training mean (the best of many candidates on a
few seeds is the luckiest as much as the best), and certifies only when a decision is likely to pass, or when the
budget ends the search. Before validation spends held-out episodes, the top few are *confirmed* on fresh training
seeds, paired with the incumbent: an unbiased estimate of their gain, which picks the one to gate. With
``decide = "end"`` it is certified only once, when the search ends; with ``decide = "every"`` and ``[planner]
final`` it holds what no gate decided, for that same final decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from ratchet.critic import Evaluation
from ratchet.policy import Candidate

__all__ = ["Entry", "Shortlist", "gate_power", "shrink"]

_NORMAL = NormalDist()


def shrink(means: Sequence[float], within_var: float, n: int) -> tuple[float, float]:
    """Empirical-Bayes (James–Stein) shrinkage of one generation's training means toward their average.

    Each candidate's mean over ``n`` episodes is its true mean plus noise of variance ``within_var / n``; the
    true means spread with variance ``tau² = max(0, var(means) − within_var / n)`` (method of moments). The
    posterior mean of a candidate is ``m + B (x − m)`` with ``m`` the average and ``B = tau² / (tau² +
    within_var / n)``.

    Source: B. Efron and C. Morris, "Stein's estimation rule and its competitors — an empirical Bayes
    approach", JASA 68 (1973).

    Args:
        means: The generation's clean candidates' training means (return units); fewer than 3 give ``B = 1``
            (nothing to estimate the spread from).
        within_var: Pooled variance of one episode's return around its candidate's mean (return units²).
        n: Episodes per candidate.

    Returns:
        ``(m, B)``: the average and the shrinkage factor in [0, 1].
    """
    x = np.asarray(means, dtype=np.float64)
    if len(x) < 3:
        return (float(x.mean()) if len(x) else 0.0), 1.0
    noise = within_var / max(1, n)
    tau2 = max(0.0, float(x.var(ddof=1)) - noise)
    return float(x.mean()), (tau2 / (tau2 + noise) if tau2 + noise > 0 else 1.0)


def gate_power(gain: float, sd: float, n: int, level: float) -> float:
    """Chance that a one-sided paired test at ``level`` on ``n`` seeds certifies a true mean gain ``gain`` when the
    paired differences have standard deviation ``sd`` (normal approximation: ``Φ(gain √n / sd − z_{1−level})``).

    Args:
        gain: Expected mean paired difference (return units); ≤ 0 gives at most ``level``.
        sd: Standard deviation of one paired difference (return units); 0 with a positive gain gives 1.
        n: Validation seeds (episodes).
        level: The decision's significance level in (0, 1).
    """
    if n < 2 or not 0.0 < level < 1.0:
        return 0.0
    if sd <= 0:
        return 1.0 if gain > 0 else 0.0
    return _NORMAL.cdf(gain * math.sqrt(n) / sd + _NORMAL.inv_cdf(level))  # z_{1-level} = -z_{level}, also at 1e-17


@dataclass
class Entry:
    """One candidate on the shortlist.

    Attributes:
        candidate: The candidate.
        generation: The generation that evaluated it first.
        estimate: Its shrunken training mean (return units), from its first training evaluation.
        n: Episodes behind ``estimate``.
        length: Its mean episode length on that evaluation (env steps): what its decision's episodes cost.
        diffs: Its paired differences against the incumbent ``against`` on confirmation seeds (return units).
    """

    candidate: Candidate
    generation: int
    estimate: float
    n: int
    length: float = 0.0
    length_sd: float = 0.0  # standard deviation of its episode lengths on its last confirmation (env steps)
    diffs: list[float] = field(default_factory=list)
    against: str = ""
    failed: bool = False  # an episode of its confirmation ended in an error: never certified

    @property
    def confirmed_gain(self) -> float | None:
        """Mean paired difference against ``against`` on confirmation seeds (None before any; -inf after an error)."""
        if self.failed:
            return -math.inf
        return float(np.mean(self.diffs)) if self.diffs else None

    @property
    def confirmed_sd(self) -> float | None:
        """Standard deviation of :attr:`diffs` (None with fewer than 2)."""
        return float(np.std(self.diffs, ddof=1)) if len(self.diffs) > 1 and not self.failed else None


@dataclass
class Shortlist:
    """The ``size`` best candidates seen so far that no gate has decided yet, by expected gain over the incumbent.

    Args:
        size: Candidates kept.

    Attributes:
        reference: The current incumbent's training returns since it became the incumbent (the gain's baseline).
        fallback: The incumbent's validation mean: the baseline while ``reference`` is empty.
        latest: The refiner's latest recommendation (CMA-ES's distribution mean): confirmed beside the top.
        diff_sd: The standard deviation of paired differences last measured (confirmation or validation), or None.
        within_var: Pooled variance of one training return around its candidate's mean (return units²).
        predicted, realised: Expected gains of entries before their confirmation, and their confirmed gains, summed
            (:meth:`calibration`).
    """

    size: int = 16
    entries: dict[str, Entry] = field(default_factory=dict)
    reference: list[float] = field(default_factory=list)
    fallback: float = 0.0
    latest: Entry | None = None
    diff_sd: float | None = None
    within_var: float | None = None
    predicted: float = 0.0
    realised: float = 0.0
    decided: set[str] = field(default_factory=set)
    leader_since: int = 0

    def observe(self, generation: int, contenders: Sequence[Candidate], train: Mapping[str, Evaluation],
                incumbent: Candidate, recommended: Candidate | None = None) -> None:
        """Take in a generation: every contender without an errored episode, shrunk toward the generation's average
        (:func:`shrink`); ``recommended`` (the refiner's recommendation) as :attr:`latest`; and the incumbent's
        returns on the same seeds, when it ran there, as the gain's baseline."""
        clean = [c for c in contenders if c.id != incumbent.id and c.id not in self.decided
                 and train[c.id].n and train[c.id].n_errors == 0]
        inc = train.get(incumbent.id)
        if inc is not None:
            self.reference.extend(float(e.episode_return) for e in inc.episodes if e.error is None)
        if not clean:
            return
        n = min(train[c.id].n for c in clean)
        variances = [float(np.var(train[c.id].returns, ddof=1)) for c in clean if train[c.id].n > 1]
        if variances:
            self.within_var = float(np.mean(variances))
        m, b = shrink([train[c.id].mean for c in clean], self.within_var or 0.0, n)
        lead = self.top(1)
        for c in clean:
            if c.id not in self.entries:
                ev = train[c.id]
                self.entries[c.id] = Entry(c, generation, m + b * (ev.mean - m), ev.n, length=ev.env_steps / ev.n)
        if recommended is not None and recommended.id in self.entries:
            self.latest = self.entries[recommended.id]
        keep = sorted(self.entries.values(), key=lambda e: -self.expected_gain(e))[:self.size]
        self.entries = {e.candidate.id: e for e in keep}
        if self.latest is not None and self.latest.candidate.id not in self.decided:
            self.entries.setdefault(self.latest.candidate.id, self.latest)
        if self.top(1) and (not lead or self.top(1)[0] is not lead[0]):
            self.leader_since = generation

    def led_by(self, generation: int) -> bool:
        """Whether ``generation`` put a new leader on the shortlist (patience counts generations without one)."""
        return self.leader_since == generation

    def top(self, k: int) -> list[Entry]:
        """The ``k`` undecided entries expected to gain most over the incumbent (:meth:`expected_gain`)."""
        return sorted(self.entries.values(), key=lambda e: -self.expected_gain(e))[:k]

    def candidates(self, k: int) -> list[Entry]:
        """What a decision confirms: the :meth:`top` ``k``, and :attr:`latest` when it is undecided and not among them."""
        out = self.top(k)
        if self.latest is not None and self.latest.candidate.id in self.entries and all(e is not self.latest for e in out):
            out.append(self.latest)
        return out

    def expected_gain(self, entry: Entry) -> float:
        """What ``entry`` is expected to gain over the incumbent (return units): its confirmed paired gain when
        confirmed against the current incumbent, else :meth:`calibration` × (its shrunken training mean minus
        :meth:`baseline`)."""
        if entry.confirmed_gain is not None:
            return entry.confirmed_gain
        return self.calibration() * (entry.estimate - self.baseline())

    def baseline(self) -> float:
        """The incumbent's expected training return: the mean of its training returns since it became the
        incumbent (never those it was selected on), or its validation mean before it has any."""
        return float(np.mean(self.reference)) if self.reference else self.fallback

    def calibration(self) -> float:
        """How much of the expected gains confirmation has borne out so far, in [0, 1] (1 before any): the
        winner's curse left after shrinkage, measured on the run itself, scales every unconfirmed expectation."""
        if self.predicted <= 0:
            return 1.0
        return min(1.0, max(0.0, self.realised / self.predicted))

    def longest(self, k: int) -> float:
        """The longest mean episode length (env steps) among the entries a decision would read
        (:meth:`candidates`; 0 when empty): what a decision's episodes are priced from."""
        return max((e.length for e in self.candidates(k)), default=0.0)

    def spread(self) -> float:
        """Standard deviation of one paired difference to plan with: the last one measured, else √2 × the pooled
        training standard deviation (independent episodes: an upper bound when pairing correlates them)."""
        if self.diff_sd is not None:
            return self.diff_sd
        return math.sqrt(2.0 * (self.within_var or 0.0))

    def confirm(self, entry: Entry, candidate: Evaluation, incumbent: Evaluation) -> None:
        """Record ``entry``'s confirmation: its paired differences against the incumbent on the same fresh seeds
        (added to earlier ones against the same incumbent)."""
        first = entry.confirmed_gain is None
        before = self.expected_gain(entry)
        if candidate.n_errors:  # an error on confirmation seeds: never certify it
            entry.failed = True
        else:
            entry.diffs.extend(float(c.episode_return - i.episode_return)
                               for c, i in zip(candidate.episodes, incumbent.episodes) if i.error is None)
            if entry.confirmed_sd is not None:
                self.diff_sd = entry.confirmed_sd
            if first and before > 0 and entry.confirmed_gain is not None:
                self.predicted += before
                self.realised += entry.confirmed_gain
        entry.against = incumbent.candidate_id
        self.reference.extend(float(e.episode_return) for e in incumbent.episodes if e.error is None)

    def decide(self, candidate_id: str, promoted: bool, validation_mean: float = 0.0, diff_sd: float | None = None
               ) -> None:
        """A gate decided ``candidate_id``: it leaves the shortlist; when ``promoted`` the baseline starts again from
        its ``validation_mean`` (its training returns are those it was selected on, biased upward) and every other
        confirmation, paired with the old incumbent, lapses. ``diff_sd``: the decision's paired differences'
        standard deviation."""
        self.decided.add(candidate_id)
        self.entries.pop(candidate_id, None)
        if self.latest is not None and self.latest.candidate.id == candidate_id:
            self.latest = None
        if diff_sd is not None and math.isfinite(diff_sd):
            self.diff_sd = diff_sd
        if promoted:
            self.reference, self.fallback = [], float(validation_mean)
            for e in self.entries.values():
                e.diffs, e.against, e.failed = [], "", False
