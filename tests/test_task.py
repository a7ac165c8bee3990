"""ratchet.task: GymTask construction, success, serialisation."""

from __future__ import annotations

import pickle

import pytest
from conftest import DATA

from ratchet.errors import TaskError
from ratchet.task import GymTask, Task, gym_spec


def test_success_threshold_defaults_to_reward_threshold():
    t = GymTask("CartPole-v1")
    assert t.success_threshold == 475.0
    assert t.is_success(475.0, False, True) is True
    assert t.is_success(474.9, True, False) is False


def test_explicit_threshold_and_none_when_env_has_none():
    assert GymTask("CartPole-v1", success_threshold=10).is_success(10.0, True, False) is True
    pend = GymTask("Pendulum-v1")
    assert pend.success_threshold is None
    assert pend.is_success(-100.0, False, True) is None


def test_unknown_env_suggests_close_match():
    with pytest.raises(TaskError, match=r"unknown Gymnasium env id 'CartPole-v9'.*did you mean .*CartPole-v1"):
        GymTask("CartPole-v9")
    with pytest.raises(TaskError, match="empty"):
        gym_spec("")


def test_bad_action_mode():
    with pytest.raises(TaskError, match="action_mode"):
        GymTask("CartPole-v1", action_mode="ignore")


def test_bad_env_kwargs_raise_task_error_when_made():
    t = GymTask("CartPole-v1", env_kwargs={"no_such_kwarg": 1})
    with pytest.raises(TaskError, match="cannot make CartPole-v1"):
        t.make_env()


def test_dict_roundtrip_and_pickle():
    t = GymTask("CartPole-v1", {"sutton_barto_reward": False}, 100.0, "clip", 50)
    assert GymTask.from_dict(t.to_dict()) == t
    assert pickle.loads(pickle.dumps(t)) == t
    assert isinstance(t, Task)
    env = t.make_env()
    try:
        assert env.spec.max_episode_steps == 50
    finally:
        env.close()


# regression (was a bug): GymTask("CartPole-v1", {"max_episode_steps": 20000}).step_limit was the registered 500,
# so the budget's worst case was 40 times too small
def test_step_limit_reads_a_time_limit_given_in_env_kwargs():
    task = GymTask("CartPole-v1", {"max_episode_steps": 20000})
    assert task.step_limit == 20000 and task.max_episode_steps == 20000 and task.env_kwargs == {}
    assert GymTask.from_dict(task.to_dict()) == task
    with pytest.raises(TaskError, match="two time limits"):
        GymTask("CartPole-v1", {"max_episode_steps": 20000}, max_episode_steps=500)


def test_step_limit_is_none_without_a_time_limit():
    assert GymTask("CliffWalking-v1").step_limit is None
    assert GymTask("CliffWalking-v1", max_episode_steps=200).step_limit == 200


def test_env_ids_that_need_an_import(monkeypatch):
    """Gymnasium's ``module:EnvId`` form: the module is imported (it registers the env), then the id is used."""
    import sys

    from ratchet.errors import TaskError

    monkeypatch.syspath_prepend(str(DATA / "envs"))
    monkeypatch.setenv("PYTHONPATH", str(DATA / "envs"))
    task = GymTask("ratchet_test_envs:RatchetCartPole-v0")
    assert task.step_limit == 200 and task.success_threshold == 190.0
    env = task.make_env()
    env.close()
    with pytest.raises(TaskError, match="needs the module 'no_such_envs_module'.*pip install no_such_envs_module"):
        GymTask("no_such_envs_module:Foo-v0")
    sys.modules.pop("ratchet_test_envs", None)


# issue 18 §6: a success rate is shown with what success is and where its threshold comes from
def test_success_rule_names_the_threshold_and_its_source():
    from ratchet.task import success_rule_of

    assert GymTask("MountainCar-v0").success_rule() == "return ≥ -110 (MountainCar-v0's registered reward_threshold)"
    assert GymTask("MountainCar-v0", success_threshold=-120).success_rule() == "return ≥ -120 ([task] success_threshold)"
    assert GymTask("Pendulum-v1").success_rule() is None  # no threshold registered, none given
    cartpole = "return ≥ 475 (CartPole-v1's registered reward_threshold)"
    assert success_rule_of(None, {"env_id": "CartPole-v1"}) == cartpole
    assert success_rule_of(None, {"env_id": "NoSuchEnv-v0"}) is None and success_rule_of(None) is None
    assert success_rule_of(GymTask("CartPole-v1").to_dict()) == cartpole
    # a threshold the spec sets is the spec's even when it equals the registered one, also as the ledger keeps it
    own = GymTask("LunarLander-v3", success_threshold=200)
    assert own.success_rule() == "return ≥ 200 ([task] success_threshold)"
    assert GymTask.from_dict(own.to_dict()).success_rule() == own.success_rule()
    registered = GymTask("LunarLander-v3")
    assert GymTask.from_dict(registered.to_dict()).success_rule() == registered.success_rule()
    assert "registered" in registered.success_rule()
    recorded_before = {k: v for k, v in own.to_dict().items() if k != "threshold_registered"}  # older ledgers
    assert "registered reward_threshold" in GymTask.from_dict(recorded_before).success_rule()


def test_every_task_kind_declares_whether_it_batches_rollouts():
    """Issue 42: a task's batched rollouts are declared in the Task contract (``batched_rollouts``), never probed for
    a ``run_batch`` method by name; a kind that declares them implements :class:`~ratchet.tasks.BatchedRollouts`."""
    import importlib

    from ratchet.tasks import TASK_KINDS

    for kind, where in TASK_KINDS.items():
        module, _, name = where.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert isinstance(cls.batched_rollouts, bool), kind
        assert callable(getattr(cls, "run_batch", None)) == cls.batched_rollouts, kind
    assert GymTask("CartPole-v1").batched_rollouts


def test_every_task_kind_declares_whether_it_records_transitions():
    """``[model] screen`` learns from recorded transitions; a task declares in the Task contract whether it records
    them (``records_transitions``), so the spec's note is decided without probing the task or naming its kind."""
    import importlib

    from ratchet.tasks import TASK_KINDS

    for kind, where in TASK_KINDS.items():
        module, _, name = where.partition(":")
        assert isinstance(getattr(importlib.import_module(module), name).records_transitions, bool), kind
    assert GymTask("CartPole-v1").records_transitions


def test_every_task_kind_declares_whether_a_promotion_changes_it():
    """Issue 42: whether a promotion may change the task (a game's league) is declared in the Task contract
    (``changes_on_promotion``), read by ``[planner] overlap_gate`` instead of probing ``after_promotion``."""
    import importlib

    from ratchet.tasks import TASK_KINDS

    for kind, where in TASK_KINDS.items():
        module, _, name = where.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert hasattr(cls, "changes_on_promotion"), kind
    assert GymTask("CartPole-v1").changes_on_promotion is False
