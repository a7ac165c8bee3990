"""ratchet.planner: seed splits, budget stop rules, generation planning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ratchet.planner import Budget, IncumbentPlanner, SeedSplits, Usage
from ratchet.spec import BudgetSpec

SPLITS = ("train", "validation", "test")


def test_seed_splits_are_deterministic():
    a, b = SeedSplits(7), SeedSplits(7)
    for split in SPLITS:
        assert a.seeds(split, 0, 50) == b.seeds(split, 0, 50)
        assert a.seed(split, 3) == b.seed(split, 3)


def test_seed_splits_are_disjoint_and_distinct():
    s = SeedSplits(0)
    got = {split: s.seeds(split, 0, 2000) for split in SPLITS}
    for split, seeds in got.items():
        assert len(set(seeds)) == len(seeds) == 2000
        assert all(isinstance(x, int) and 0 <= x < 2**32 for x in seeds)
        assert {x % 3 for x in seeds} == {SPLITS.index(split)}
    assert not set(got["train"]) & set(got["validation"])
    assert not set(got["train"]) & set(got["test"])
    assert not set(got["validation"]) & set(got["test"])


def test_seed_splits_differ_between_run_seeds():
    for split in SPLITS:
        assert set(SeedSplits(0).seeds(split, 0, 20)).isdisjoint(SeedSplits(1).seeds(split, 0, 20))


def test_seeds_windows_are_consistent():
    s = SeedSplits(3)
    whole = s.seeds("train", 0, 30)
    assert s.seeds("train", 10, 10) == whole[10:20]


def budget(**kw) -> Budget:
    return Budget(BudgetSpec(**kw))


def test_default_budget_is_bounded():
    assert BudgetSpec().env_steps == 100_000
    assert BudgetSpec(episodes=10).env_steps is None


def test_stop_reason_target():
    b = budget(env_steps=1000, target=475.0)
    assert b.stop_reason(Usage(), 474.99, 0) is None
    assert b.stop_reason(Usage(), 475.0, 0).startswith("target reached")


def test_stop_reason_patience():
    b = budget(env_steps=1000, patience=3)
    assert b.stop_reason(Usage(), 0.0, 2) is None
    assert b.stop_reason(Usage(), 0.0, 3).startswith("patience")


def test_stop_reason_env_steps_and_episodes():
    b = budget(env_steps=1000, episodes=50)
    assert b.stop_reason(Usage(env_steps=999, episodes=49), 0.0, 0) is None
    assert b.stop_reason(Usage(env_steps=1000, episodes=0), 0.0, 0) == "env-step budget used"
    assert b.stop_reason(Usage(env_steps=0, episodes=50), 0.0, 0) == "episode budget used"


def test_stop_reason_wall_clock_can_be_ignored_during_replay():
    b = budget(wall_clock_s=10.0)
    assert b.stop_reason(Usage(wall_clock_s=10.0), 0.0, 0) == "wall-clock budget used"
    assert b.stop_reason(Usage(wall_clock_s=10.0), 0.0, 0, check_clock=False) is None


def test_each_stop_carries_its_kind_whatever_its_wording():
    from ratchet.planner import StopKind

    b = budget(env_steps=1000, episodes=50, target=5.0, patience=3, wall_clock_s=10.0)
    kinds = [b.stop_reason(Usage(), 5.0, 0).kind, b.stop_reason(Usage(), 0.0, 3).kind,
             b.stop_reason(Usage(env_steps=1000), 0.0, 0).kind, b.stop_reason(Usage(episodes=50), 0.0, 0).kind,
             b.stop_reason(Usage(wall_clock_s=10.0), 0.0, 0).kind]
    assert kinds == [StopKind.TARGET, StopKind.PATIENCE, StopKind.BUDGET, StopKind.BUDGET, StopKind.CLOCK]
    assert json.dumps(b.stop_reason(Usage(env_steps=1000), 0.0, 0)) == '"env-step budget used"'  # recorded as text


def test_target_checked_before_budget():
    b = budget(env_steps=100, target=10.0)
    assert b.stop_reason(Usage(env_steps=500), 20.0, 0).startswith("target reached")


def test_can_afford():
    b = budget(env_steps=1000, episodes=10)
    assert b.can_afford(Usage(env_steps=500, episodes=5), 500, 5) is True
    assert b.can_afford(Usage(env_steps=500, episodes=5), 501, 1) is False
    assert b.can_afford(Usage(env_steps=0, episodes=5), 1, 6) is False
    assert budget(wall_clock_s=5.0).can_afford(Usage(env_steps=10**9), 10**9, 10**6) is True


def test_planner_draws_fresh_train_seeds_each_generation():
    splits = SeedSplits(0)
    p = IncumbentPlanner(splits, train_episodes=4, max_share=0.3, budget=budget(env_steps=10_000))
    plans = [p.plan(g) for g in range(1, 6)]
    seen = [s for pl in plans for s in pl.train_seeds]
    assert len(seen) == len(set(seen)) == 20
    assert [pl.generation for pl in plans] == [1, 2, 3, 4, 5]
    assert seen == splits.seeds("train", 0, 20)
    assert p.plan(3) == plans[2]


def test_can_afford_generation_has_a_safety_margin():
    p = IncumbentPlanner(SeedSplits(0), train_episodes=2, max_share=0.3, budget=budget(env_steps=1000))
    # 4 candidates x 2 episodes x 100 steps = 800, x1.25 = 1000: just fits from zero
    assert p.can_afford_generation(Usage(), 4, 100.0) is True
    assert p.can_afford_generation(Usage(env_steps=1), 4, 100.0) is False


def test_should_gate_respects_budget():
    p = IncumbentPlanner(SeedSplits(0), train_episodes=2, max_share=0.3, budget=budget(env_steps=1000))
    assert p.should_gate(Usage(env_steps=950), 10, 10.0) is False  # 100 more steps do not fit
    # priced by the observed length (no time limit given) with a 25 % margin: 125 steps must fit
    assert p.should_gate(Usage(env_steps=900, validation_env_steps=0), 10, 10.0) is False
    assert p.should_gate(Usage(env_steps=875, validation_env_steps=0), 10, 10.0) is True  # 100/975 <= 0.3


@pytest.mark.parametrize("share", [0.3, 0.5])
def test_should_gate_respects_max_share_when_budget_is_far(share):
    p = IncumbentPlanner(SeedSplits(0), train_episodes=2, max_share=share, budget=budget(env_steps=10**9))
    used = Usage(env_steps=10_000, validation_env_steps=int(share * 10_000))
    assert p.should_gate(used, 10, 100.0) is False  # (share*10k + 1k) / 11k > share
    fresh = Usage(env_steps=10_000, validation_env_steps=0)
    assert p.should_gate(fresh, 10, 100.0) is True


# -- weakness-focused training seeds --------------------------------------------------------------

def _ep(seed, ret, success=None, error=None):
    from ratchet.rollout import Episode

    return Episode(seed, float(ret), 10, error is None, False, success, error)


def test_weakness_pool_weights_by_shortfall_and_forgets_solved_seeds():
    from ratchet.planner import WeaknessPool

    pool = WeaknessPool(max_size=3)
    pool.update([_ep(1, 100, False), _ep(2, 190, False), _ep(3, 250, True), _ep(4, 0, error="boom")], reference=200)
    assert pool.weights[1] == pytest.approx(100) and pool.weights[2] == pytest.approx(10)
    assert 3 not in pool.weights and 4 in pool.weights
    pool.update([_ep(1, 230, True)], reference=200)  # the incumbent now lands seed 1
    assert 1 not in pool.weights
    pool.update([_ep(5, -50, False), _ep(6, -80, False)], reference=200)
    assert len(pool) == 3 and 2 not in pool.weights  # only the worst three stay


def test_weakness_pool_samples_in_proportion_to_weight():
    from ratchet.planner import WeaknessPool

    pool = WeaknessPool()
    pool.update([_ep(10, 0, False), _ep(20, 199, False)], reference=200)  # weights 200 and 1
    rng = np.random.default_rng(0)
    draws = [pool.sample(1, rng)[0] for _ in range(400)]
    assert draws.count(10) > 370
    assert sorted(pool.sample(5, rng)) == [10, 20]  # never more than the pool holds, no repeats


def test_plan_mixes_pool_and_fresh_seeds_deterministically():
    from ratchet.planner import Budget, IncumbentPlanner, SeedSplits
    from ratchet.spec import BudgetSpec

    def planner(share):
        p = IncumbentPlanner(SeedSplits(3), 5, 0.3, Budget(BudgetSpec(env_steps=10_000)), weakness_share=share)
        p.pool.update([_ep(s, 0, False) for s in (3, 6, 9, 12)], reference=200)
        return p

    plain = planner(0.0).plan(4)
    assert plain.weak_seeds == () and len(plain.train_seeds) == 5
    a, b = planner(0.4).plan(4), planner(0.4).plan(4)
    assert a == b and len(a.weak_seeds) == 2 and set(a.weak_seeds) <= {3, 6, 9, 12}
    assert len(a.train_seeds) == 5 and set(a.train_seeds) - set(a.weak_seeds) <= set(plain.train_seeds)


def test_run_with_weakness_share_replays_failed_training_seeds(tmp_path):
    from conftest import make_spec_dir, read_events

    from ratchet.ledger.projection import project
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec = load_spec(make_spec_dir(tmp_path / "s", planner={"weakness_share": 0.6}, refiner={"train_episodes": 5},
                                   budget={"env_steps": 60_000, "target": 500},
                                   test={"episodes": 3}, execution={"workers": 1}))
    start_run(spec, tmp_path / "runs", "weak")
    st = project(read_events(tmp_path / "runs" / "weak"))
    weak = [s for g in st.generation_log for s in g["weak_seeds"]]
    assert weak, "the incumbent fails CartPole at first, so later generations should revisit those seeds"
    assert all(s % 3 == 0 for s in weak)  # train split only
    earlier = {s for g in st.generation_log for s in g["train_seeds"]}
    assert set(weak) <= earlier


def test_the_last_chance_gate_fires_under_an_episode_budget():
    """Regression: the last-chance check was passed 0 episodes for the next generation, so under an
    ``episodes`` budget it never saw that no generation would follow."""
    p = IncumbentPlanner(SeedSplits(0), train_episodes=2, max_share=0.1, budget=budget(episodes=100))
    used = Usage(env_steps=1000, episodes=80, validation_env_steps=100)
    assert p.should_gate(used, 10, 10.0, next_generation_steps=100, next_generation_episodes=20) is True
    assert p.should_gate(used, 10, 10.0, next_generation_steps=100, next_generation_episodes=5) is False
    hold = p.validation_hold(used, 10, 10.0, next_generation_steps=100, next_generation_episodes=5)
    assert "max_share = 0.1" in hold and "18 % of env steps" in hold


def test_the_screen_says_why_a_candidate_is_not_gated():
    from ratchet.critic import Evaluation
    from ratchet.rollout import Episode

    def ev(cid, returns):
        return Evaluation(cid, "train", tuple(Episode(i, r, 10, True, False) for i, r in enumerate(returns)))

    inc = ev("inc", [10.0, 20.0])
    assert "paired mean difference -5.00" in IncumbentPlanner.screen(ev("c", [5.0, 15.0]), inc, 0.0)
    assert "not above the incumbent's validation mean 30.00" in IncumbentPlanner.screen(ev("c", [20.0, 30.0]), inc,
                                                                                          30.0)
    assert IncumbentPlanner.screen(ev("c", [40.0, 30.0]), inc, 30.0) is None


def _pricing(**kw):
    from ratchet.planner import Pricing

    spec = BudgetSpec(**kw)
    planner = IncumbentPlanner(SeedSplits(0), train_episodes=2, max_share=0.3, budget=Budget(spec))
    return Pricing(spec, Usage(env_steps=500, episodes=10), planner, 100, 100, validation_episodes=6,
                   train_episodes=2)


# new-user pass: "no room for a single generation (10 episodes: 5 candidates × 2 training episodes, and 6 for its
# gate ...)": the count named must be the total the generation and its gate need (16), not the training part
def test_the_episode_budget_stop_names_the_total_a_generation_and_its_gate_need():
    stop = _pricing(episodes=20, env_steps=None).no_room_message(5, 50.0, 50.0, first=True)
    assert "(16 episodes: 5 candidates × 2 training episodes, and 6 for its gate;" in stop


# new-user pass: the env-step budget's stop advised "[refiner] popsize" for a spec written with [[refiners]] tables
def test_the_budget_stop_names_the_refiners_popsize_whatever_the_spec_calls_it():
    for kw in ({"episodes": 20, "env_steps": None}, {"env_steps": 1000}):
        stop = _pricing(**kw).no_room_message(5, 50.0, 50.0, first=True)
        assert "lower the refiners' popsize / [planner] train_episodes" in stop and "[refiner]" not in stop
