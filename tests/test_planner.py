"""ratchet.planner: seed splits, budget stop rules, generation planning."""

from __future__ import annotations

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
    assert p.should_gate(Usage(env_steps=900, validation_env_steps=0), 10, 10.0) is True  # 100/1000 <= 0.3


@pytest.mark.parametrize("share", [0.3, 0.5])
def test_should_gate_respects_max_share_when_budget_is_far(share):
    p = IncumbentPlanner(SeedSplits(0), train_episodes=2, max_share=share, budget=budget(env_steps=10**9))
    used = Usage(env_steps=10_000, validation_env_steps=int(share * 10_000))
    assert p.should_gate(used, 10, 100.0) is False  # (share*10k + 1k) / 11k > share
    fresh = Usage(env_steps=10_000, validation_env_steps=0)
    assert p.should_gate(fresh, 10, 100.0) is True
