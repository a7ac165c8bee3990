"""ratchet.gate: the one-sided paired test that decides promotions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ratchet.critic import Evaluation
from ratchet.gate import PairedTestGate
from ratchet.rollout import Episode

SEEDS = list(range(100, 120))


def ev(cid: str, returns, seeds=None, errors=()) -> Evaluation:
    seeds = SEEDS[:len(returns)] if seeds is None else seeds
    eps = []
    for i, (s, r) in enumerate(zip(seeds, returns)):
        if i in errors:
            eps.append(Episode.failed(s, "policy raised ValueError: x", length=3, episode_return=float(r)))
        else:
            eps.append(Episode(s, float(r), int(abs(r)) + 1, True, False, None))
    return Evaluation(cid, "validation", tuple(eps))


@pytest.fixture(params=["t", "wilcoxon"])
def gate(request):
    return PairedTestGate(alpha=0.05, test=request.param)


def base(n=20, seed=0):
    return np.random.default_rng(seed).normal(100.0, 20.0, size=n)


def test_clear_improvement_promotes(gate):
    inc = base()
    gain = np.random.default_rng(1).normal(15.0, 3.0, size=20)
    d = gate.decide(ev("cand", inc + gain), ev("inc", inc))
    assert d.promoted is True
    assert d.p_value < 0.001
    assert math.isclose(d.mean_diff, float(gain.mean()), rel_tol=1e-9)
    assert (d.candidate_id, d.incumbent_id, d.n, d.test, d.alpha) == ("cand", "inc", 20, gate.test, 0.0125)  # α/(2·1·2)
    assert "better" in d.reason
    assert d.to_dict()["promoted"] is True


def test_identical_returns_do_not_promote(gate):
    inc = base()
    d = gate.decide(ev("cand", inc), ev("inc", inc))
    assert d.promoted is False and d.p_value == 1.0 and d.mean_diff == 0.0


def test_symmetric_noise_does_not_promote(gate):
    inc = base()
    noise = np.random.default_rng(2).normal(0.0, 5.0, size=10)
    diffs = np.concatenate([noise, -noise])  # mean exactly zero, p about 0.5
    d = gate.decide(ev("cand", inc + diffs), ev("inc", inc))
    assert d.promoted is False
    assert d.p_value > 0.2


def test_tiny_positive_mean_with_noise_is_not_significant(gate):
    inc = base()
    diffs = np.random.default_rng(3).normal(0.0, 10.0, size=20)
    diffs = diffs - diffs.mean() + 0.5  # mean +0.5, std 10: far from significant
    d = gate.decide(ev("cand", inc + diffs), ev("inc", inc))
    assert d.mean_diff > 0
    assert d.promoted is False and d.p_value >= 0.05
    assert "not significant" in d.reason


def test_worse_does_not_promote(gate):
    inc = base()
    d = gate.decide(ev("cand", inc - 10.0 - np.abs(base(seed=4)) / 10), ev("inc", inc))
    assert d.promoted is False and d.mean_diff < 0 and d.p_value > 0.5


def test_errored_candidate_episode_blocks_promotion(gate):
    inc = base()
    d = gate.decide(ev("cand", inc + 50.0, errors={7}), ev("inc", inc))
    assert d.promoted is False and d.p_value == 1.0 and math.isnan(d.mean_diff)
    assert "1 validation episode(s) failed" in d.reason


def test_all_equal_positive_differences_give_p_zero(gate):
    inc = np.full(10, 200.0)
    d = gate.decide(ev("cand", inc + 300.0), ev("inc", inc))  # e.g. every episode now at the time limit
    assert d.p_value == 0.0 and d.promoted is True and d.mean_diff == 300.0


def test_all_equal_negative_differences_give_p_one(gate):
    inc = np.full(10, 200.0)
    d = gate.decide(ev("cand", inc - 1.0), ev("inc", inc))
    assert d.p_value == 1.0 and d.promoted is False


def test_min_improvement(gate):
    inc = base()
    g = PairedTestGate(alpha=0.05, test=gate.test, min_improvement=20.0)
    d = g.decide(ev("cand", inc + 15.0 + base(seed=5) / 100), ev("inc", inc))
    assert d.promoted is False and "not above 20" in d.reason
    assert g.decide(ev("cand", inc + 25.0 + base(seed=5) / 100), ev("inc", inc)).promoted is True


def test_single_pair_never_promotes(gate):
    d = gate.decide(ev("cand", [500.0]), ev("inc", [10.0]))
    assert d.promoted is False and d.p_value == 1.0


def test_mismatched_seeds_raise(gate):
    with pytest.raises(ValueError, match="same validation seeds"):
        gate.decide(ev("cand", base(10), seeds=SEEDS[1:11]), ev("inc", base(10)))
    with pytest.raises(ValueError):
        gate.decide(ev("cand", base(10)), ev("inc", base(9)))
    with pytest.raises(ValueError):  # order matters: pairs are matched position by position
        gate.decide(ev("cand", base(10), seeds=SEEDS[:10][::-1]), ev("inc", base(10)))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_alpha_validation(alpha):
    with pytest.raises(ValueError, match="alpha"):
        PairedTestGate(alpha=alpha)


def test_test_name_validation():
    with pytest.raises(ValueError, match="test must be"):
        PairedTestGate(test="z")


def test_p_values_match_scipy():
    inc = base()
    cand = inc + np.random.default_rng(6).normal(2.0, 6.0, size=20)
    d = cand - inc
    t = PairedTestGate(test="t").decide(ev("c", cand), ev("i", inc))
    assert math.isclose(t.p_value, stats.ttest_rel(cand, inc, alternative="greater").pvalue, rel_tol=1e-9)
    w = PairedTestGate(test="wilcoxon").decide(ev("c", cand), ev("i", inc))
    assert math.isclose(w.p_value, stats.wilcoxon(d, alternative="greater", zero_method="zsplit").pvalue, rel_tol=1e-9)


def test_wilcoxon_is_robust_to_one_outlier_where_t_is_not():
    inc = np.full(12, 100.0)
    # eleven small losses, one huge gain: mean difference positive, but most seeds got worse
    diffs = np.array([-1.0, -1.5, -2.0, -1.2, -0.8, -1.1, -1.4, -0.9, -1.3, -1.6, -1.7, 60.0])
    cand = inc + diffs
    w = PairedTestGate(test="wilcoxon").decide(ev("c", cand), ev("i", inc))
    assert w.mean_diff > 0 and w.promoted is False and w.p_value > 0.5


def test_incumbent_mean_never_decreases_on_promotion(gate):
    rng = np.random.default_rng(7)
    for _ in range(50):
        inc = rng.normal(100.0, 30.0, size=10)
        cand = inc + rng.normal(rng.uniform(-5, 10), 8.0, size=10)
        d = gate.decide(ev("c", cand), ev("i", inc))
        if d.promoted:
            assert cand.mean() > inc.mean()


# -- alpha spending and regression obligations ------------------------------------------------------

def test_harmonic_spending_levels_sum_to_alpha():
    from ratchet.gate import spending_level

    levels = [spending_level(0.05, k, "harmonic") for k in range(1, 10_001)]
    assert levels[:3] == pytest.approx([0.0125, 0.05 / 12, 0.05 / 24])
    # the levels sum to alpha/2; under the null about half the decisions are contested, hence alpha
    assert sum(levels) < 0.025 and sum(levels) == pytest.approx(0.025, rel=1e-3)
    assert spending_level(0.05, 7, "none") == 0.05


def test_later_decisions_need_stronger_evidence():
    gate = PairedTestGate(alpha=0.05)
    inc = base()
    gain = np.random.default_rng(3).normal(1.0, 2.5, size=20)  # p around 0.03–0.05
    first, tenth = gate.decide(ev("c", inc + gain), ev("inc", inc), k=1), gate.decide(ev("c", inc + gain), ev("inc", inc), k=10)
    assert first.p_value == tenth.p_value
    assert tenth.alpha == pytest.approx(0.05 / 220)
    assert first.promoted or first.p_value >= 0.0125
    assert not tenth.promoted and "α_10" in tenth.reason
    assert PairedTestGate(alpha=0.05, spending="none").decide(ev("c", inc + gain), ev("inc", inc), k=10).alpha == 0.05


def test_fallback_carries_the_level_of_a_promotion_to_the_next_decision():
    from ratchet.gate import fallback_level

    assert fallback_level(0.05, 3, "harmonic") == pytest.approx(0.05 / 24)
    assert fallback_level(0.05, 3, "harmonic", carry=0.0125) == pytest.approx(0.05 / 24 + 0.0125)
    assert fallback_level(0.05, 2, "every", carry=0.05) == 0.05  # never above alpha
    assert fallback_level(0.05, 9, "none", carry=0.05) == 0.05  # each decision at alpha already: nothing carried
    with pytest.raises(ValueError):
        fallback_level(0.05, 1, "harmonic", carry=-0.01)
    gate = PairedTestGate(alpha=0.05)
    inc = base()
    gain = np.random.default_rng(3).normal(1.0, 2.5, size=20)  # p around 0.03–0.05: fails α_2 alone
    alone = gate.decide(ev("c", inc + gain), ev("inc", inc), k=2)
    after_promotion = gate.decide(ev("c", inc + gain), ev("inc", inc), k=2, carry=0.0125)
    assert after_promotion.alpha == pytest.approx(0.05 / 12 + 0.0125) and alone.alpha == pytest.approx(0.05 / 12)
    assert after_promotion.p_value == alone.p_value
    seq = SequentialGate(alpha=0.05, method="group-t")
    assert seq.start(2, 50, carry=0.025).level == pytest.approx(0.05 / 6 + 0.025)


def test_fallback_keeps_the_run_wide_level_when_true_gains_precede_null_candidates():
    """Runs where the first decisions are on truly better candidates (promoted, passing their level on) and the
    rest on no-better ones: the chance of any false promotion stays at most alpha."""
    from ratchet.gate import fallback_level

    rng = np.random.default_rng(21)
    runs, n, decisions, alpha = 4000, 30, 12, 0.05
    better = np.arange(decisions) < 3
    d = better[None, :, None] * 1.5 + rng.standard_normal((runs, decisions, n))
    p = stats.ttest_1samp(d, 0.0, axis=2, alternative="greater").pvalue
    carry, false = np.zeros(runs), np.zeros(runs, bool)
    for i in range(decisions):
        level = np.array([fallback_level(alpha, i + 1, "every", c) for c in carry])
        promoted = (d[:, i].mean(1) > 0) & (p[:, i] < level)
        false |= promoted & ~better[i]
        carry = np.where(promoted, level, 0.0)
    false_runs = int(false.sum())
    assert false_runs / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs)
    assert false_runs > 0  # the carried level is really used


def _success_ev(cid, returns, successes):
    return Evaluation(cid, "validation", tuple(Episode(i, float(r), 10, True, False, bool(s))
                                                for i, (r, s) in enumerate(zip(returns, successes))))


def test_regression_obligation_rejects_new_failures_despite_higher_mean():
    inc = _success_ev("inc", [200.0] * 20, [True] * 20)
    # far higher mean, but fails 3 of the 20 seeds the incumbent succeeds on
    cand = _success_ev("cand", [400.0] * 17 + [150.0] * 3, [True] * 17 + [False] * 3)
    assert PairedTestGate().decide(cand, inc).promoted
    strict = PairedTestGate(max_new_failures=0.1).decide(cand, inc)
    assert not strict.promoted and "newly fails 3 of 20" in strict.reason
    assert PairedTestGate(max_new_failures=0.2).decide(cand, inc).promoted


def test_bad_spending_and_obligation_rejected():
    with pytest.raises(ValueError):
        PairedTestGate(spending="bonferroni")
    with pytest.raises(ValueError):
        PairedTestGate(max_new_failures=1.5)
    with pytest.raises(ValueError):
        PairedTestGate().decide(ev("c", base()), ev("i", base()), k=0)


# -- sequential gates ---------------------------------------------------------------------------------

from ratchet.gate import SequentialGate, betting_log_capital, group_sequential_level, make_gate


def crash_noise(rng, size):
    """Mean 0, variance 1, left-skewed: slightly better on 90 % of seeds, much worse (a crash) on 10 %."""
    crash = rng.random(size) < 0.1
    return np.where(crash, -2.85, 0.3167) + np.clip(0.316 * rng.standard_normal(size), -1, 1)


def drive(gate, d, k=1, cap=None):
    s = gate.start(k, len(d) if cap is None else cap)
    while (b := s.next_batch_size()) > 0:
        s.add(d[s.n:s.n + b])
    return s.decision()


BET = SequentialGate(alpha=0.05, return_range=(0.0, 4.0))  # differences in units of σ, bounded below by -4σ


def test_betting_level_on_skewed_null_where_t_tests_fail():
    rng = np.random.default_rng(11)
    n, cap = 3000, 50
    d = crash_noise(rng, (n, cap))  # mean-zero differences: every promotion is false
    rate = np.mean([drive(BET, row).promoted for row in d])
    level = 0.05 / 2  # α_1 with "every" spending
    assert rate <= level + 3 * math.sqrt(level * (1 - level) / n)
    # the fixed-n t-test, at the same level, promotes this null far more often than its level
    p = stats.ttest_1samp(d, 0.0, axis=1, alternative="greater").pvalue
    assert np.mean(p < level) > 3 * level


@pytest.mark.parametrize("method", ["betting", "group-t"])
def test_run_wide_false_promotion_rate_at_most_alpha(method):
    rng = np.random.default_rng(12)
    gate = SequentialGate(alpha=0.05, method=method, return_range=(0.0, 4.0))
    runs, decisions = 300, 10
    d = np.clip(rng.standard_normal((runs, decisions, 50)), -4, 4)
    any_false = [any(drive(gate, d[r, k], k=k + 1).promoted for k in range(decisions)) for r in range(runs)]
    assert np.mean(any_false) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)


@pytest.mark.parametrize("method", ["betting", "group-t"])
def test_power_on_a_known_gain_with_fewer_episodes_than_the_cap(method):
    rng = np.random.default_rng(13)
    gate = SequentialGate(alpha=0.05, method=method, return_range=(0.0, 4.0))
    decisions = [drive(gate, 0.8 + np.clip(rng.standard_normal(50), -3, 3)) for _ in range(400)]
    assert np.mean([d.promoted for d in decisions]) >= 0.9
    assert np.mean([d.episodes_used for d in decisions]) < 0.8 * 50
    promoted = next(d for d in decisions if d.promoted)
    assert promoted.stopped_because == "efficacy" and promoted.contested
    if method == "betting":
        assert promoted.e_value >= 1 / promoted.alpha and promoted.p_value == pytest.approx(1 / promoted.e_value)


def test_null_candidates_stop_early_for_futility():
    rng = np.random.default_rng(14)
    decisions = [drive(BET, np.clip(rng.standard_normal(100), -4, 4)) for _ in range(200)]
    assert np.mean([d.episodes_used for d in decisions]) < 60
    assert {d.stopped_because for d in decisions} <= {"futility", "cap", "efficacy"}
    assert any(d.stopped_because == "futility" and d.episodes_used == 20 for d in decisions)


def test_sequential_decision_is_deterministic_and_replay_matches_session():
    inc = base(40)
    cand = inc + np.random.default_rng(15).normal(10.0, 15.0, size=40)
    gate = SequentialGate(return_range=(0.0, 400.0))
    seeds = list(range(40))
    a = gate.decide(ev("c", cand, seeds=seeds), ev("i", inc, seeds=seeds), k=2)
    b = gate.decide(ev("c", cand, seeds=seeds), ev("i", inc, seeds=seeds), k=2)
    assert a == b
    assert drive(gate, cand - inc, k=2).to_dict() | {"candidate_id": "c", "incumbent_id": "i"} == a.to_dict()
    assert a.alpha == pytest.approx(0.05 / 6) and a.test == "betting"
    assert set(a.to_dict()) >= {"promoted", "p_value", "n", "contested", "episodes_used", "e_value", "stopped_because"}


@pytest.mark.parametrize("method", ["betting", "group-t"])
def test_all_equal_differences(method):
    gate = SequentialGate(method=method, return_range=(0.0, 100.0))
    up = drive(gate, np.full(50, 30.0))
    assert up.promoted and up.stopped_because == "efficacy" and up.episodes_used < 50
    flat = drive(gate, np.zeros(50))  # zero variance, zero gain
    assert not flat.promoted and flat.stopped_because == "futility" and flat.episodes_used == 20


def test_nan_and_bad_input_rejected():
    s = BET.start(1, 20)
    with pytest.raises(ValueError, match="finite"):
        s.add([1.0, float("nan")])
    with pytest.raises(ValueError, match="cap"):
        s.add(np.zeros(21))
    s.add(np.full(10, -1.0))
    s.add(np.full(10, -1.0))
    assert s.status == "reject"
    with pytest.raises(ValueError, match="already stopped"):
        s.add([1.0])
    assert s.next_batch_size() == 0


def test_difference_below_the_range_rejects():
    s = BET.start(1, 50)
    assert s.add([1.0] * 9 + [-4.5]) == "reject"
    d = s.decision()
    assert not d.promoted and d.stopped_because == "out_of_range" and not d.contested


def test_errors_and_new_failures_reject():
    gate = SequentialGate(return_range=(0.0, 500.0), max_new_failures=0.1)
    s = gate.start(1, 20)
    assert s.add_evaluations(ev("c", base(10) + 50, errors={3}), ev("i", base(10))) == "reject"
    assert s.decision().stopped_because == "error"
    inc = _success_ev("inc", [200.0] * 20, [True] * 20)
    cand = _success_ev("cand", [400.0] * 17 + [150.0] * 3, [True] * 17 + [False] * 3)
    d = gate.decide(cand, inc)
    assert not d.promoted and d.stopped_because == "regression" and "newly fails" in d.reason


def test_min_improvement_is_the_null():
    gate = SequentialGate(return_range=(0.0, 20.0), min_improvement=5.0)
    rng = np.random.default_rng(16)
    assert not drive(gate, 4.0 + rng.normal(0, 1, 50)).promoted
    assert drive(gate, 9.0 + rng.normal(0, 1, 50)).promoted


def test_unfinished_session_does_not_promote():
    s = BET.start(1, 50)
    s.add(np.full(10, 0.5))
    d = s.decision()
    assert s.status == "continue" and not d.promoted and d.stopped_because == "unfinished"
    assert s.next_batch_size() == 10


def test_sequential_settings_validated():
    with pytest.raises(ValueError, match="range of returns"):
        SequentialGate().start(1, 50)
    for bad in ({"method": "z"}, {"batch": 1}, {"return_range": (1.0, 1.0)}, {"spending": "x"},
                {"max_bet": 1.0}, {"alpha": 1.0}, {"min_improvement": -1.0}):
        with pytest.raises(ValueError):
            SequentialGate(**bad)
    with pytest.raises(ValueError):
        BET.start(0, 50)
    with pytest.raises(ValueError):
        BET.start(1, 50, lower_bound=1.0)
    assert isinstance(make_gate("group-t", batch=5), SequentialGate)
    assert isinstance(make_gate("wilcoxon"), PairedTestGate)
    with pytest.raises(ValueError, match="test must be"):
        make_gate("sequential-z")


def test_betting_capital_vectorised_and_group_sequential_spending_sums_to_level():
    x = np.random.default_rng(17).uniform(-1, 1, size=(3, 30))
    rows = np.stack([betting_log_capital(r) for r in x])
    assert np.allclose(betting_log_capital(x), rows) and np.all(betting_log_capital(x)[:, 0] == 0.0)
    looks = [10, 20, 30, 40, 50]
    spent = [group_sequential_level(0.01, n, p, 50) for n, p in zip(looks, [0] + looks[:-1])]
    assert sum(spent) == pytest.approx(0.01) and spent == sorted(spent)


def test_higher_futility_bound_stops_no_better_candidates_sooner():
    rng = np.random.default_rng(18)
    d = np.clip(rng.standard_normal((200, 100)), -4, 4)
    used = {ft: np.mean([drive(SequentialGate(return_range=(0.0, 4.0), futility_t=ft), row).episodes_used
                         for row in d]) for ft in (0.0, 1.0)}
    assert used[1.0] < used[0.0]
    with pytest.raises(ValueError, match="futility_t"):
        SequentialGate(futility_t=float("nan"))


@pytest.mark.parametrize("test", ["t", "wilcoxon", "betting", "group-t"])
def test_every_gate_is_driven_by_one_session_protocol(test):
    """The loop drives every gate the same way; a fixed-n test is a session of one batch of every seed, and
    its decision is exactly :meth:`PairedTestGate.decide`'s."""
    rng = np.random.default_rng(4)
    inc = rng.normal(0, 1, 60)
    cand = inc + 0.8 + rng.normal(0, 0.3, 60)
    gate = make_gate(test, 0.05, **({"return_range": (-2.0, 2.0)} if test == "betting" else {}))
    session = gate.start(1, 60, candidate_id="c", incumbent_id="i")
    read = 0
    while (b := session.next_batch_size()) > 0:
        session.add_evaluations(ev("c", cand[read:read + b], seeds=range(read, read + b)),
                                ev("i", inc[read:read + b], seeds=range(read, read + b)))
        read += b
    decision = session.decision()
    assert decision.promoted and gate.first_look(60) <= 60 and 0 < gate.price(60) <= 60
    if test in ("t", "wilcoxon"):
        assert read == 60 and gate.first_look(60) == gate.price(60) == 60
        assert decision == gate.decide(ev("c", cand, seeds=range(60)), ev("i", inc, seeds=range(60)))
        with pytest.raises(ValueError, match="already been made"):
            session.add_evaluations(ev("c", cand), ev("i", inc))


def test_the_exact_gate_promotes_a_strict_improvement_beyond_its_tolerance_without_statistics():
    """A deterministic task's gate (``[gate] test = "exact"``): one validation episode each, promoted only when better
    by more than tolerance × max(1, |incumbent|), never by rounding; an errored episode never promotes."""
    from ratchet.gate import ExactGate, make_gate

    g = make_gate("exact", 0.05, tolerance=1e-9)
    assert isinstance(g, ExactGate) and g.first_look(50) == 1 and g.price(50) == 1
    better = g.decide(ev("c", [2.63]), ev("i", [2.62]))
    assert better.promoted and better.test == "exact" and better.n == 1 and "no statistics" in better.reason
    assert not g.decide(ev("c", [1.0 + 1e-10]), ev("i", [1.0])).promoted  # rounding, not an improvement
    assert g.decide(ev("c", [1.0 + 1e-8]), ev("i", [1.0])).promoted
    assert not g.decide(ev("c", [1000.0 + 1e-7]), ev("i", [1000.0])).promoted  # relative: 1e-6 needed at 1000
    assert not g.decide(ev("c", [5.0], errors=(0,)), ev("i", [1.0])).promoted
    assert not g.decide(ev("c", [1.0]), ev("i", [1.0])).promoted
    session = g.start(1, 50)  # the loop drives it as any gate: one batch of one seed
    assert session.next_batch_size() == 1
    assert session.add_evaluations(ev("c", [3.0]), ev("i", [2.0])) == "promote" and session.next_batch_size() == 0
    with pytest.raises(ValueError, match="same seed"):
        g.decide(ev("c", [3.0], seeds=[1]), ev("i", [2.0], seeds=[2]))
