"""The gate: a candidate replaces the incumbent only if a paired test on validation seeds says so."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np
from scipy import special, stats

from ratchet.critic import Evaluation

_NORMAL = NormalDist()

__all__ = ["Decision", "ExactGate", "FixedSession", "Gate", "GateSession", "PairedTestGate", "SequentialGate", "betting_log_capital",
           "fallback_level", "group_sequential_level", "make_gate", "spending_level", "worse_against"]


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
        alpha: Significance level used for this decision (after alpha spending, plus the level a promotion just
            before it passed on: :func:`fallback_level`).
        contested: Whether this decision spent alpha; the caller counts these to number the next decision
            (``k = contested decisions so far + 1``). :class:`PairedTestGate`: the mean difference was positive.
            :class:`SequentialGate`: at least one look was made (every tested decision spends).
        reason: One line explaining the verdict.
        episodes_used: Validation episodes of the candidate the decision read (one per paired seed; a sequential
            gate may stop before the full validation set). None for :class:`PairedTestGate`, which reads all ``n``.
        e_value: The e-value (capital of the test martingale) at the stop, :class:`SequentialGate` with
            ``method="betting"`` only; promotion needs ``e_value >= 1 / alpha``.
        stopped_because: Why a sequential decision stopped: ``"efficacy"`` (evidence crossed the boundary),
            ``"futility"`` (mean difference not above ``min_improvement`` at a look), ``"cap"`` (the full
            validation set was read), ``"error"`` (an errored candidate episode), ``"out_of_range"`` (a paired
            difference below the declared range), ``"regression"`` (``max_new_failures``). None for the fixed-n test.
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
    episodes_used: int | None = None
    e_value: float | None = None
    stopped_because: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class Gate(Protocol):
    """Decides promotions from validation evaluations only. Every gate is driven the same way: a session
    (:meth:`start`) asks for the next batch of paired validation seeds until it decides; a fixed-n test is a
    session with a single batch of every seed."""

    def decide(self, candidate: Evaluation, incumbent: Evaluation, k: int = 1, carry: float = 0.0) -> Decision:
        """Compare two evaluations on the same validation seeds as the run's ``k``-th decision; ``carry`` is the
        level of the previous decision when it promoted (:func:`fallback_level`)."""

    def start(self, k: int = 1, cap: int = 50, *, lower_bound: float | None = None, candidate_id: str = "",
              incumbent_id: str = "", carry: float = 0.0) -> Any:
        """Open the run's ``k``-th decision over at most ``cap`` paired validation seeds: an object with
        ``next_batch_size()``, ``add_evaluations(candidate, incumbent)`` and ``decision()``
        (:class:`GateSession`, :class:`FixedSession`)."""

    def first_look(self, n_validation: int) -> int:
        """Validation seeds the incumbent is evaluated on before the first decision (of ``n_validation``)."""

    def price(self, n_validation: int) -> int:
        """Validation episodes one decision is priced at, of ``n_validation`` seeds."""


class FixedSession:
    """A fixed-n decision as a session of one batch: every seed at once, then :meth:`PairedTestGate.decide`.

    Made by :meth:`PairedTestGate.start` (and :meth:`ExactGate.start`, one seed); the same calls as
    :class:`GateSession`.
    """

    def __init__(self, gate: PairedTestGate | ExactGate, k: int, cap: int, carry: float) -> None:
        self.gate, self.k, self.cap, self.carry = gate, k, cap, carry
        self._decision: Decision | None = None
        self.n = 0

    def next_batch_size(self) -> int:
        """Every seed (``cap``) before the decision; 0 after it."""
        return 0 if self._decision is not None else self.cap

    def add_evaluations(self, candidate: Evaluation, incumbent: Evaluation) -> str:
        """Decide on the one batch: ``"promote"`` or ``"reject"``.

        Raises:
            ValueError: as :meth:`PairedTestGate.decide`, or the decision is already made.
        """
        if self._decision is not None:
            raise ValueError("the decision has already been made; start a new session")
        self._decision = self.gate.decide(candidate, incumbent, k=self.k, carry=self.carry)
        self.n = candidate.n
        return "promote" if self._decision.promoted else "reject"

    def decision(self) -> Decision:
        """The verdict.

        Raises:
            ValueError: no batch was added yet.
        """
        if self._decision is None:
            raise ValueError("no validation seeds were added to the decision yet")
        return self._decision


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
    ``"every"``: ``alpha / (k (k + 1))`` where *every* tested decision counts (:class:`SequentialGate`). The levels
    sum to ``alpha`` and the union bound needs no assumption about how often decisions are contested: the run-wide
    chance of any false promotion is at most ``alpha`` whatever the distribution of the paired differences.
    ``"none"``: ``alpha`` for every decision (each decision alone is a level-``alpha`` test).

    Raises:
        ValueError: ``k < 1`` or an unknown ``spending``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if spending == "none":
        return alpha
    if spending == "harmonic":
        return alpha / (2 * k * (k + 1))
    if spending == "every":
        return alpha / (k * (k + 1))
    raise ValueError(f"spending must be \"harmonic\", \"every\" or \"none\", got {spending!r}")


def fallback_level(alpha: float, k: int, spending: str, carry: float = 0.0) -> float:
    """Level of the run's ``k``-th decision under the *fallback* rule: its own share
    (:func:`spending_level`) plus ``carry``, the level of the decision just before it when that one promoted
    (0 otherwise; chains of promotions pass their levels on). With ``spending="none"`` every decision is
    tested at ``alpha`` and nothing is carried.

    Why it keeps the run-wide guarantee: a share of α moves on only through promotions, so before the
    run's first false promotion every share reaches at most one decision that does not promote, and a
    decision on a candidate that is not better either does not promote (the chain stops there) or is that
    first false promotion. On every run the levels of decisions on not-better candidates up to the first
    false promotion therefore add up to at most the sum of the shares, and the chance of any false promotion
    stays at most ``alpha``: the union-bound argument of :func:`spending_level`, unchanged, with the unused
    level of a true promotion recycled instead of thrown away. The price is nothing: a run with no true gain
    never carries anything. The gain is power where it matters, after each real improvement.

    Source: the fallback procedure, B. L. Wiens, "A fixed sequence Bonferroni procedure for testing multiple
    endpoints", Pharmaceutical Statistics 2(3), 2003, and B. L. Wiens and A. Dmitrienko, "The fallback
    procedure for evaluating a single family of hypotheses", J. Biopharm. Stat. 15(6), 2005; in its online
    form ("online fallback", FWER under arbitrary dependence): J. Tian and A. Ramdas, "Online control of the
    familywise error rate", Statistical Methods in Medical Research 30(4), 2021, Section 3.

    Raises:
        ValueError: ``k < 1``, an unknown ``spending`` or a negative ``carry``.
    """
    if not carry >= 0:
        raise ValueError(f"carry must be >= 0, got {carry}")
    level = spending_level(alpha, k, spending)
    return level if spending == "none" else min(alpha, level + carry)


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
    candidates need stronger evidence, so tasks with noisy returns need more validation episodes. Two things
    win most of that power back without weakening the guarantee: the *fallback* rule (the caller passes
    ``carry``, the level of the previous decision when it promoted; :func:`fallback_level`), so a run that
    keeps finding real gains keeps testing at about the level of its first decision; and more validation
    seeds per decision (the planner's training screen keeps decisions few): lunar_lander's crash-or-land
    paired differences have a standard deviation of about 100 return units against gains of +15 to +30,
    which 50 seeds rarely certify at α/4 but 200 seeds do (p = 6e-5 to 5e-4; see the example's README).
    Refreshing validation seeds would not remove the multiplicity; an anytime-valid test would, but
    needs more episodes per decision (:class:`SequentialGate`).

    Caveat: the t-test's level assumes roughly normal mean differences. Crash-or-land returns give skewed paired
    differences (a candidate slightly better on most seeds, crashing on a few); with such a mean-zero difference
    the run-wide false-promotion rate measured 0.3 at 50 validation seeds and 0.9 at 12
    (``benchmarks/gate_power.py``). :class:`SequentialGate` with ``method="betting"`` keeps α there.

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
        if spending == "every":
            raise ValueError(f"[gate] spending = \"every\" is for the sequential tests (test = \"betting\" or "
                             f"\"group-t\"); with test = {test!r} use \"harmonic\" (run-wide) or \"none\"")
        if spending not in ("harmonic", "none"):
            raise ValueError(f"spending must be \"harmonic\" or \"none\", got {spending!r}")
        if max_new_failures is not None and not 0.0 <= max_new_failures <= 1.0:
            raise ValueError(f"max_new_failures must be in [0, 1], got {max_new_failures}")
        self.alpha, self.test, self.min_improvement = alpha, test, min_improvement
        self.spending, self.max_new_failures = spending, max_new_failures

    def decide(self, candidate: Evaluation, incumbent: Evaluation, k: int = 1, carry: float = 0.0) -> Decision:
        """Decide on ``candidate``; if contested (positive mean difference) it is the run's ``k``-th
        contested decision (1-based), which sets its level. The caller counts contested decisions:
        :attr:`Decision.contested`.

        Args:
            carry: The level (:attr:`Decision.alpha`) of the run's previous decision when it promoted, else 0:
                added to this decision's level (:func:`fallback_level`).

        Raises:
            ValueError: the two evaluations do not cover the same seeds, ``k < 1`` or ``carry < 0``.
        """
        if candidate.seeds != incumbent.seeds:
            raise ValueError("candidate and incumbent must be evaluated on the same validation seeds")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        n = candidate.n
        level = fallback_level(self.alpha, k, self.spending, carry)

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

    def start(self, k: int = 1, cap: int = 50, *, lower_bound: float | None = None, candidate_id: str = "",
              incumbent_id: str = "", carry: float = 0.0) -> FixedSession:
        """The run's ``k``-th decision as a session of one batch of ``cap`` seeds (``lower_bound`` and the ids
        are not needed by this test; the evaluations carry the ids).

        Raises:
            ValueError: ``k < 1`` or ``cap < 1``.
        """
        if k < 1 or cap < 1:
            raise ValueError(f"k and cap must be >= 1, got {k} and {cap}")
        return FixedSession(self, k, cap, carry)

    def first_look(self, n_validation: int) -> int:
        """Every validation seed: the fixed-n test reads them all."""
        return n_validation

    def price(self, n_validation: int) -> int:
        """Every validation seed."""
        return n_validation

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


def worse_against(candidate: Evaluation, incumbent: Evaluation, level: float) -> str | None:
    """Why ``candidate`` is refused for playing significantly worse than ``incumbent`` against some single opponent
    of a game's validation episodes (each episode's ``diagnostics["opponent"]``), or None.

    Per opponent, a one-sided paired t-test of "the candidate is worse" on the episodes against it, at
    ``level / m`` for ``m`` opponents (Bonferroni): when the candidate is no worse against any, the chance of a
    refusal is at most ``level``. The guard against strategy cycles (a candidate that beats the incumbent on
    average by losing to one opponent the incumbent beat); it only ever refuses, so the gate's run-wide guarantee
    holds as it is. Episodes without an opponent (other tasks) are not grouped: None.

    Raises:
        ValueError: the evaluations do not cover the same seeds, or ``level`` is not in (0, 1).
    """
    if candidate.seeds != incumbent.seeds:
        raise ValueError("candidate and incumbent must be evaluated on the same validation seeds")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    groups: dict[str, list[float]] = {}
    for c, i in zip(candidate.episodes, incumbent.episodes):
        opponent = c.diagnostics.get("opponent")
        if opponent is not None:
            groups.setdefault(str(opponent), []).append(c.episode_return - i.episode_return)
    each = level / max(1, len(groups))
    worst: tuple[float, str, float, int] | None = None
    for name, diffs in sorted(groups.items()):
        d = np.asarray(diffs, dtype=np.float64)
        if len(d) < 2 or d.mean() >= 0:
            continue
        p = 0.0 if np.all(d == d[0]) else float(stats.ttest_1samp(d, 0.0, alternative="less").pvalue)
        if p < each and (worst is None or p < worst[0]):
            worst = (p, name, float(d.mean()), len(d))
    if worst is None:
        return None
    p, name, mean, n = worst
    return (f"worse against {name}: {mean:+.3f} on its {n} validation episodes (p = {p:.2g} < {each:.3g}, "
            "[gate] worse_against_any)")


# -- sequential gates -------------------------------------------------------------------------------

def betting_log_capital(x: np.ndarray, max_bet: float = 0.9, prior_var: float = 1 / 64,
                        prior_n: float = 1.0) -> np.ndarray:
    """Log capital of the one-sided betting test martingale after each paired seed.

    Bets a predictable fraction ``λ_i`` of the capital on each scaled difference ``x_i``:
    ``K_n = Π_{i≤n} (1 + λ_i x_i)``. ``λ_i`` is the approximate growth-rate-optimal ("aGRAPA") bet of
    Waudby-Smith & Ramdas (2023), ``μ̂ / (σ̂² + μ̂²)`` from the pairs before ``i`` (shrunk towards a prior of
    ``prior_n`` pseudo-pairs with mean 0 and second moment ``prior_var``), clipped to ``[0, max_bet]``.

    Validity: if every ``x_i ≥ -1`` and ``E[x_i | earlier pairs] ≤ 0``, each factor has conditional mean ≤ 1 and
    stays positive (``λ_i ≤ max_bet < 1``), so ``K`` is a nonnegative supermartingale starting at 1 and Ville's
    inequality gives ``P(sup_n K_n ≥ 1/a) ≤ a``. Upward ``x`` needs no bound.

    Args:
        x: Scaled differences, shape ``(..., n)`` (pairs along the last axis), each ``≥ -1``.
        max_bet: Largest fraction of capital bet on one pair, in (0, 1).
        prior_var: Prior second moment of ``x`` (the first bets' scale).
        prior_n: Weight of the prior, in pairs.

    Returns:
        ``log K_1 … log K_n``, same shape as ``x``, float64.

    Source: I. Waudby-Smith and A. Ramdas, "Estimating means of bounded random variables by betting", JRSS B 86(1),
    2024 (arXiv:2010.09686), Sections 4–5 (capital process, aGRAPA).
    """
    x = np.asarray(x, dtype=np.float64)
    zeros = np.zeros(x.shape[:-1] + (1,))
    s = np.concatenate([zeros, np.cumsum(x, axis=-1)[..., :-1]], axis=-1)
    ss = np.concatenate([zeros, np.cumsum(x * x, axis=-1)[..., :-1]], axis=-1)
    count = np.arange(x.shape[-1]) + prior_n
    mu, m2 = s / count, (ss + prior_n * prior_var) / count
    lam = np.clip(mu / np.maximum(m2, 1e-300), 0.0, max_bet)
    return np.cumsum(np.log1p(lam * x), axis=-1)


def group_sequential_level(alpha: float, n: int, n_prev: int, cap: int) -> float:
    """Share of ``alpha`` a group-sequential t-test spends at a look after ``n`` paired seeds.

    Lan–DeMets spending function of O'Brien–Fleming type, ``f(t) = 2 - 2 Φ(z_{α/2} / √t)`` at information
    fraction ``t = n / cap`` (``f(1) = α``); the look spends ``f(n/cap) - f(n_prev/cap)``. The looks are combined by
    the union bound (Bonferroni over looks), which is valid whatever their correlation and slightly conservative.

    Source: K. K. G. Lan and D. L. DeMets, "Discrete sequential boundaries for clinical trials", Biometrika 70(3),
    1983; P. C. O'Brien and T. R. Fleming, "A multiple testing procedure for clinical trials", Biometrics 35, 1979.
    """
    z = -_NORMAL.inv_cdf(alpha / 2)  # z_{1-α/2}, exact for the tiniest alpha too

    def spent(t: float) -> float:
        return 0.0 if t <= 0 else 2 - 2 * _NORMAL.cdf(z / math.sqrt(min(t, 1.0)))

    return max(0.0, spent(n / cap) - spent(n_prev / cap))


class GateSession:
    """One sequential gate decision, fed a batch of paired validation seeds at a time.

    Made by :meth:`SequentialGate.start`. The caller runs the candidate on the next
    :meth:`next_batch_size` validation seeds (in the fixed validation order), adds the paired differences with
    :meth:`add` (or the evaluations with :meth:`add_evaluations`), and repeats while :attr:`status` is
    ``"continue"``; :meth:`decision` then gives the verdict.
    """

    def __init__(self, gate: SequentialGate, k: int, cap: int, lower_bound: float | None,
                 candidate_id: str, incumbent_id: str, carry: float = 0.0) -> None:
        self.gate, self.k, self.cap, self.lower_bound = gate, k, cap, lower_bound
        self.candidate_id, self.incumbent_id = candidate_id, incumbent_id
        self.level = fallback_level(gate.alpha, k, gate.spending, carry)
        self.diffs: list[float] = []
        self.status = "continue"
        self.stopped_because: str | None = None
        self.reason = "no validation episode read yet"
        self.looks = 0
        self.e_value: float | None = 1.0 if gate.method == "betting" else None
        self.max_e = 1.0
        self.p_value = 1.0
        self._held = self._new_failures = self._last_n = 0

    @property
    def n(self) -> int:
        """Paired validation seeds read so far (candidate episodes)."""
        return len(self.diffs)

    @property
    def mean_diff(self) -> float:
        """Mean paired difference candidate − incumbent so far (return units; NaN before any pair)."""
        return float(np.mean(self.diffs)) if self.diffs else float("nan")

    def next_batch_size(self) -> int:
        """How many more validation seeds to run the candidate on (episodes); 0 once the decision has stopped."""
        if self.status != "continue":
            return 0
        return min(self.gate.batch, self.cap - self.n)

    def add_evaluations(self, candidate: Evaluation, incumbent: Evaluation) -> str:
        """Add the next batch as two evaluations on the same seeds (the next seeds of the validation order).

        An errored candidate episode stops the decision (reject); ``max_new_failures`` is checked on every
        seed read so far before a promotion.

        Returns:
            The new :attr:`status`.

        Raises:
            ValueError: the evaluations' seeds differ, or the session has already stopped.
        """
        if candidate.seeds != incumbent.seeds:
            raise ValueError("candidate and incumbent must be evaluated on the same validation seeds")
        self._check_open()
        if candidate.n_errors:
            return self._stop("reject", "error", f"{candidate.n_errors} validation episode(s) failed with an error")
        d = self._validated(candidate.returns - incumbent.returns)
        held = [c.success is not True for c, i in zip(candidate.episodes, incumbent.episodes) if i.success is True]
        self._held, self._new_failures = self._held + len(held), self._new_failures + sum(held)
        return self.add(d)

    def add(self, diffs: list[float] | np.ndarray) -> str:
        """Add paired differences candidate − incumbent (return units) of the next seeds and look at the evidence.

        Returns:
            The new :attr:`status`: ``"promote"``, ``"reject"`` or ``"continue"``.

        Raises:
            ValueError: a difference is not finite, too many seeds for the cap, or the session has stopped.
        """
        self._check_open()
        d = self._validated(diffs)
        if len(d) == 0:
            return self.status
        self.diffs.extend(d.tolist())
        if self.lower_bound is not None and np.any(d < self.lower_bound):
            worst = float(d.min())
            return self._stop("reject", "out_of_range", f"paired difference {worst:+.3f} below the declared range "
                                                        f"(lower bound {self.lower_bound:+.3f}): the test's assumption "
                                                        "fails; rejected")
        return self._look()

    def decision(self) -> Decision:
        """The verdict so far as a :class:`Decision` (not promoted while the status is still ``"continue"``)."""
        promoted = self.status == "promote"
        reason = self.reason if self.status != "continue" else f"unfinished after {self.n} of {self.cap} seeds"
        return Decision(self.candidate_id, self.incumbent_id, promoted, self.p_value, self.mean_diff, self.n,
                        self.gate.method, self.level, reason, self.looks > 0, self.n, self.e_value,
                        self.stopped_because if self.status != "continue" else "unfinished")

    # -- internals
    def _validated(self, diffs: list[float] | np.ndarray) -> np.ndarray:
        d = np.asarray(diffs, dtype=np.float64).ravel()
        if not np.all(np.isfinite(d)):
            raise ValueError(f"paired differences must be finite, got {d[~np.isfinite(d)][:3].tolist()}")
        if self.n + len(d) > self.cap:
            raise ValueError(f"expected at most {self.cap - self.n} more paired seeds (cap {self.cap}), got {len(d)}")
        return d

    def _check_open(self) -> None:
        if self.status != "continue":
            raise ValueError(f"the decision has already stopped ({self.stopped_because}); start a new session")

    def _stop(self, status: str, because: str, reason: str) -> str:
        self.status, self.stopped_because, self.reason = status, because, reason
        return status

    def _look(self) -> str:
        g, n, k = self.gate, self.n, self.k
        prev = self._last_n
        self.looks += 1
        self._last_n = n
        d = np.asarray(self.diffs) - g.min_improvement
        mean = self.mean_diff
        if g.method == "betting":
            assert self.lower_bound is not None  # SequentialGate.start refuses "betting" without one
            scale = g.min_improvement - self.lower_bound  # x = (d - m) / scale >= -1
            log_k = betting_log_capital(d / scale, g.max_bet, g.prior_var)
            self.max_e = float(np.exp(min(log_k.max(), 700.0)))
            self.e_value = float(np.exp(min(log_k[-1], 700.0)))
            self.p_value = min(1.0, 1.0 / self.max_e)
            crossed = self.max_e >= 1.0 / self.level
            if crossed:
                self.e_value = self.max_e
            evidence = f"e-value {self.max_e:.3g} vs 1/α_{k} = {1 / self.level:.4g}"
        else:
            look_level = group_sequential_level(self.level, n, prev, self.cap)
            self.p_value = _t_p_value(d)
            crossed = self.p_value < look_level
            evidence = f"p = {self.p_value:.3g} vs look level {look_level:.3g} (α_{k} = {self.level:.4g})"
        if crossed and mean > g.min_improvement:
            if g.max_new_failures is not None and self._held and self._new_failures / self._held > g.max_new_failures:
                return self._stop("reject", "regression",
                                  f"newly fails {self._new_failures} of {self._held} validation seeds the incumbent "
                                  f"succeeds on (more than {100 * g.max_new_failures:g} %)")
            return self._stop("promote", "efficacy", f"better by {mean:+.3f} after {n} seeds ({evidence})")
        if n >= self.cap:
            return self._stop("reject", "cap", f"not significant after all {n} seeds: {evidence}")
        if n >= g.min_episodes and _t_statistic(d) <= g.futility_t:
            return self._stop("reject", "futility", f"mean difference {mean:+.3f} after {n} seeds: t statistic of "
                                                    f"d − {g.min_improvement:g} not above {g.futility_t:g}")
        self.reason = f"continue after {n} seeds: {evidence}"
        return self.status


def _t_statistic(d: np.ndarray) -> float:
    """Paired t statistic of mean(d) > 0 (±inf or 0 when every difference is equal)."""
    if np.all(d == d[0]):
        return math.copysign(math.inf, d[0]) if d[0] != 0 else 0.0
    return float(d.mean()) / (float(d.std(ddof=1)) / math.sqrt(len(d)))


def _t_p_value(d: np.ndarray) -> float:
    """One-sided paired t-test p-value for mean(d) > 0 (all-equal differences: 0 if positive, else 1)."""
    if len(d) < 2:
        return 1.0
    if np.all(d == d[0]):
        return 0.0 if d[0] > 0 else 1.0
    p = float(special.stdtr(len(d) - 1, -_t_statistic(d)))  # as scipy.stats.ttest_1samp, without its overhead
    return p if math.isfinite(p) else 1.0


class SequentialGate:
    """Sequential paired gate: evaluate a candidate in batches of validation seeds until the evidence decides.

    The candidate runs on the fixed validation seeds ``batch`` at a time, in the fixed order; after each batch the
    gate looks at the paired differences ``d_i = candidate_i − incumbent_i`` (return units) and stops with
    *promote* when the evidence crosses this decision's boundary, *reject* when the t statistic of
    ``d − min_improvement`` is at most ``futility_t`` after at least ``min_episodes`` seeds (futility; with the
    default 0: the mean difference is not above ``min_improvement``; stopping to reject never adds a false
    promotion) or when ``cap`` seeds gave no decisive evidence. Candidates that are no better stop after
    ``min_episodes`` seeds about half the time, and clearly better ones stop early, so the mean validation
    episodes per decision fall well below the cap.

    Methods:

    ``"betting"`` (default): a one-sided betting test martingale for H0: ``E[d] ≤ min_improvement``
    (Waudby-Smith & Ramdas 2024, aGRAPA bets; see :func:`betting_log_capital`). Promote when the capital (the
    e-value) reaches ``1 / α_k``. Valid for any distribution of ``d`` bounded below by ``lower_bound``
    (``lo − hi`` of ``return_range``): no normality, no symmetry, so crash-or-land returns whose mean-zero
    differences are skewed (a candidate slightly better on most seeds, crashing on a few) do not fool it, where
    t-tests promote them far more often than α (``benchmarks/gate_power.py``). A difference below the bound
    stops the decision with a rejection. The price is power when the range is wide compared with the
    spread of ``d``: use a larger ``cap`` (100–200 validation seeds); the early stops keep the mean cost low.

    ``"group-t"``: a group-sequential paired t-test (O'Brien–Fleming-type Lan–DeMets spending of ``α_k`` across
    the looks, union bound over looks; :func:`group_sequential_level`). About the fixed-n t-test's power with
    about half its episodes, but, like it, valid only for roughly normal differences.

    Run-wide validity: the k-th tested decision has level ``α_k`` (:func:`spending_level`, ``"every"``:
    ``α / (k (k + 1))``, summing to α), plus the level of the previous decision when that one promoted
    (``carry``, :func:`fallback_level`). By Ville's inequality a decision promotes a candidate that is not
    better with probability at most ``α_k``, whatever the stopping rule, and the union bound over decisions
    keeps the chance of any false promotion in a run at most α.

    Args:
        alpha: Run-wide significance level in (0, 1).
        method: ``"betting"`` or ``"group-t"``.
        batch: Validation seeds (candidate episodes) per look, ≥ 2.
        min_episodes: No futility stop before this many seeds (episodes), ≥ 1.
        futility_t: Futility bound on the running t statistic (default 0). Higher stops no-better candidates
            sooner at some cost in power: with normal differences, a cap of 200 seeds, batches of 10 and a bound
            of 4σ, 0.5 instead of 0 cut the mean episodes of a null decision from 64 to 40 and the chance of
            promoting +0.4σ as the 1st decision from 0.95 to 0.87
            (``python benchmarks/gate_power.py --runs 1000 --caps 200 --futility-t 0.5``, and ``0``).
        return_range: ``(lo, hi)`` episode returns can take (return units); sets the lower bound ``lo − hi`` of
            a paired difference. Required for ``"betting"`` unless :meth:`start` gets ``lower_bound``.
        spending: ``"every"`` (default), ``"harmonic"`` (half as large, valid but conservative here) or
            ``"none"``.
        min_improvement: Minimum mean paired gain to promote (return units, ≥ 0): the null is
            ``E[d] ≤ min_improvement``.
        max_new_failures: As :class:`PairedTestGate`, checked over the seeds read before a promotion.
        max_bet: Largest fraction of capital bet on one pair (``"betting"``), in (0, 1).
        prior_var: Prior second moment of the scaled difference ``d / (hi − lo)`` for the first bets.

    Raises:
        ValueError: a setting out of range.
    """

    def __init__(self, alpha: float = 0.05, method: str = "betting", batch: int = 10, min_episodes: int = 20,
                 return_range: tuple[float, float] | None = None, spending: str = "every",
                 min_improvement: float = 0.0, max_new_failures: float | None = None, max_bet: float = 0.9,
                 prior_var: float = 1 / 64, futility_t: float = 0.0) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if method not in ("betting", "group-t"):
            raise ValueError(f"method must be \"betting\" or \"group-t\", got {method!r}")
        if batch < 2 or min_episodes < 1:
            raise ValueError(f"batch must be >= 2 and min_episodes >= 1, got {batch} and {min_episodes}")
        if spending not in ("every", "harmonic", "none"):
            raise ValueError(f"spending must be \"every\", \"harmonic\" or \"none\", got {spending!r}")
        if return_range is not None and not (len(return_range) == 2 and math.isfinite(return_range[0])
                                             and math.isfinite(return_range[1]) and return_range[0] < return_range[1]):
            raise ValueError(f"return_range must be finite (lo, hi) with lo < hi, got {return_range!r}")
        if min_improvement < 0 or not math.isfinite(min_improvement):
            raise ValueError(f"min_improvement must be finite and >= 0, got {min_improvement}")
        if max_new_failures is not None and not 0.0 <= max_new_failures <= 1.0:
            raise ValueError(f"max_new_failures must be in [0, 1], got {max_new_failures}")
        if not 0.0 < max_bet < 1.0 or not prior_var > 0:
            raise ValueError(f"max_bet must be in (0, 1) and prior_var > 0, got {max_bet} and {prior_var}")
        self.alpha, self.method, self.batch, self.min_episodes = alpha, method, batch, min_episodes
        self.return_range, self.spending, self.min_improvement = return_range, spending, min_improvement
        if not math.isfinite(futility_t):
            raise ValueError(f"futility_t must be finite, got {futility_t}")
        self.max_new_failures, self.max_bet, self.prior_var = max_new_failures, max_bet, prior_var
        self.futility_t = futility_t

    def start(self, k: int = 1, cap: int = 50, *, lower_bound: float | None = None, candidate_id: str = "",
              incumbent_id: str = "", carry: float = 0.0) -> GateSession:
        """Open the run's ``k``-th tested decision (1-based), reading at most ``cap`` validation seeds.

        Args:
            k: Tested decisions so far + 1 (count :attr:`Decision.contested`).
            cap: Most paired validation seeds (candidate episodes) this decision may read, ≥ 2.
            lower_bound: Smallest possible paired difference (return units, < 0); overrides ``return_range``.
                It must not depend on the validation episodes (use the task's declared range, or the range of
                returns seen on *training* seeds with a safety margin).
            candidate_id: Recorded in the :class:`Decision`.
            incumbent_id: Recorded in the :class:`Decision`.
            carry: The level of the run's previous decision when it promoted, else 0 (:func:`fallback_level`).

        Raises:
            ValueError: ``k < 1``, ``cap < 2``, ``carry < 0``, or ``"betting"`` without a bound.
        """
        if cap < 2:
            raise ValueError(f"cap must be >= 2, got {cap}")
        if lower_bound is None and self.return_range is not None:
            lower_bound = self.return_range[0] - self.return_range[1]
        if lower_bound is not None and not (math.isfinite(lower_bound) and lower_bound < 0):
            raise ValueError(f"lower_bound must be finite and < 0, got {lower_bound}")
        if self.method == "betting" and lower_bound is None:
            raise ValueError("the betting gate needs the range of returns: set return_range=(lo, hi) or pass "
                             "lower_bound (smallest possible candidate − incumbent difference)")
        return GateSession(self, k, cap, lower_bound, candidate_id, incumbent_id, carry)

    def first_look(self, n_validation: int) -> int:
        """The seeds the first decision reads before it may stop: ``max(batch, min_episodes)``, at most all."""
        return min(n_validation, max(self.batch, self.min_episodes))

    def price(self, n_validation: int) -> int:
        """Twice the seeds a decision reads before it may stop for futility (a decision that is no better stops
        there about half the time; one cut short by the budget simply does not promote), at most all."""
        return min(n_validation, 2 * max(self.batch, self.min_episodes))

    def decide(self, candidate: Evaluation, incumbent: Evaluation, k: int = 1, carry: float = 0.0) -> Decision:
        """The :class:`Gate` protocol on complete evaluations: replay them batch by batch in seed order.

        Gives the verdict the sequential gate would have reached, with :attr:`Decision.episodes_used` the seeds
        it would have needed (the caller already paid for all of them; drive a :class:`GateSession` to save them).

        Raises:
            ValueError: the two evaluations do not cover the same seeds, ``k < 1``, or no bound (``"betting"``).
        """
        if candidate.seeds != incumbent.seeds:
            raise ValueError("candidate and incumbent must be evaluated on the same validation seeds")
        session = self.start(k, max(2, candidate.n), candidate_id=candidate.candidate_id,
                             incumbent_id=incumbent.candidate_id, carry=carry)
        while (b := session.next_batch_size()) > 0 and session.n < candidate.n:
            part = slice(session.n, session.n + b)
            session.add_evaluations(Evaluation(candidate.candidate_id, candidate.split, candidate.episodes[part]),
                                    Evaluation(incumbent.candidate_id, incumbent.split, incumbent.episodes[part]))
        return session.decision()


class ExactGate:
    """The gate of a deterministic task (``[gate] test = "exact"``, :attr:`ratchet.tasks.Task.deterministic`): one
    validation episode each, no statistics. A candidate is promoted when it finished its episode without an error and
    its score beats the incumbent's by more than ``max(min_improvement, tolerance × max(1, |incumbent's score|))``
    (:meth:`margin`): a strict improvement, never one of rounding. The decider (:mod:`ratchet.deciders.exact`) checks
    first that this validation episode repeats the candidate's training score exactly.

    Args:
        alpha: Kept for the :class:`Gate` protocol (alpha spending is not used: no test is made); in (0, 1).
        min_improvement: Smallest gain that promotes (return units, ≥ 0).
        tolerance: Relative tolerance (≥ 0; return units for scores below 1 in magnitude).

    Raises:
        ValueError: a setting out of range.
    """

    spending = "none"

    def __init__(self, alpha: float = 0.05, min_improvement: float = 0.0, tolerance: float = 1e-9) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if not (math.isfinite(min_improvement) and min_improvement >= 0 and math.isfinite(tolerance)
                and tolerance >= 0):
            raise ValueError(f"min_improvement and tolerance must be finite and >= 0, got {min_improvement} and "
                             f"{tolerance}")
        self.alpha, self.min_improvement, self.tolerance = alpha, min_improvement, tolerance

    def margin(self, incumbent_score: float) -> float:
        """How much a candidate's score must exceed ``incumbent_score`` to be promoted (return units)."""
        return max(self.min_improvement, self.tolerance * max(1.0, abs(incumbent_score)))

    def decide(self, candidate: Evaluation, incumbent: Evaluation, k: int = 1, carry: float = 0.0) -> Decision:
        """Compare the first validation episode of each (the same seed).

        Raises:
            ValueError: either evaluation is empty, or they start on different seeds.
        """
        if not candidate.n or not incumbent.n or candidate.seeds[0] != incumbent.seeds[0]:
            raise ValueError("candidate and incumbent must each have one validation episode on the same seed")
        c, i = candidate.episodes[0], incumbent.episodes[0]
        diff = c.episode_return - i.episode_return if c.error is None else 0.0
        need = self.margin(i.episode_return)
        promoted = c.error is None and diff > need
        if c.error is not None:
            reason = f"failed its validation episode: {' '.join(str(c.error).split())[:200]}"
        elif promoted:
            reason = (f"better by {diff:+.9g} ({c.episode_return:.9g} vs {i.episode_return:.9g}; exact, no statistics "
                      "needed)")
        else:
            reason = (f"not better by more than the tolerance {need:.3g}: {c.episode_return:.9g} vs "
                      f"{i.episode_return:.9g}")
        return Decision(candidate.candidate_id, incumbent.candidate_id, promoted, 0.0 if promoted else 1.0, diff, 1,
                        "exact", 0.0, reason, episodes_used=1, stopped_because="exact")

    def start(self, k: int = 1, cap: int = 50, *, lower_bound: float | None = None, candidate_id: str = "",
              incumbent_id: str = "", carry: float = 0.0) -> FixedSession:
        """A session of one batch of one validation seed (``cap`` is ignored: one episode decides)."""
        return FixedSession(self, k, 1, carry)

    def first_look(self, n_validation: int) -> int:
        """One validation episode (of ``n_validation`` seeds)."""
        return min(1, n_validation)

    def price(self, n_validation: int) -> int:
        """One validation episode per decision."""
        return min(1, n_validation)


def make_gate(test: str = "t", alpha: float = 0.05, **settings: Any) -> PairedTestGate | SequentialGate | ExactGate:
    """The gate a ``[gate] test`` setting names: ``"t"`` / ``"wilcoxon"`` (:class:`PairedTestGate`, fixed n),
    ``"betting"`` / ``"group-t"`` (:class:`SequentialGate`) or ``"exact"`` (:class:`ExactGate`, a deterministic
    task). ``settings`` go to the constructor.

    Raises:
        ValueError: an unknown ``test`` or setting.
    """
    if test == "exact":
        return ExactGate(alpha=alpha, **settings)
    if test in ("t", "wilcoxon"):
        return PairedTestGate(alpha=alpha, test=test, **settings)
    if test in ("betting", "group-t"):
        return SequentialGate(alpha=alpha, method=test, **settings)
    raise ValueError(f"test must be \"t\", \"wilcoxon\", \"betting\", \"group-t\" or \"exact\", got {test!r}")
