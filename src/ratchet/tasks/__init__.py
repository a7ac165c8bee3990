"""The Task contract: what one episode of a task is, and the registry of task kinds.

Everything above the execution layer — the loop, planner, critic, gate, report, replay and export — talks to a
task only through :class:`Task` and never names a kind. A kind is a class registered in :data:`TASK_KINDS`
(``[task] kind`` in a spec, ``"kind"`` in :meth:`Task.to_dict`); :func:`task_from_spec` and
:func:`task_from_dict` build one. Today: ``"gym"`` (:class:`~ratchet.tasks.gym.GymTask`, any registered
Gymnasium environment) and ``"evaluator"`` (:class:`~ratchet.tasks.evaluator.EvaluatorTask`, a user's
evaluator scoring the policy's functions on problem instances) and ``"game"`` (:class:`~ratchet.tasks.game.GameTask`,
a PettingZoo or OpenSpiel game against a pool of opponents) and ``"openevolve"``
(:class:`~ratchet.tasks.openevolve.OpenEvolveTask`, an OpenEvolve example's evaluator, run in the sandbox).

An episode of any task: a seed in; out a return (higher is better), a length in the task's cost unit (env
steps for an environment), how it ended (terminated, truncated — kept apart, as Gymnasium does — or an
error), success by the task's rule, and diagnostics. What runs on the trusted side (the environment, the
sums of rewards) is the task's; the policy runs sandboxed and only answers what it is asked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from ratchet.errors import TaskError

__all__ = ["TASK_KINDS", "BatchedRollouts", "PolicyHandle", "Task", "kind_class", "success_rule_of", "task_from_dict",
           "task_from_spec"]

#: Task kind -> ``"module:Class"``; the class has ``from_spec(table)`` and ``from_dict(d)``.
TASK_KINDS: dict[str, str] = {"gym": "ratchet.tasks.gym:GymTask",
                              "evaluator": "ratchet.tasks.evaluator:EvaluatorTask",
                              "game": "ratchet.tasks.game:GameTask",
                              "openevolve": "ratchet.tasks.openevolve:OpenEvolveTask"}


class PolicyHandle(Protocol):
    """The candidate as a task's episode sees it, on the trusted side: a sandboxed policy process
    (:class:`ratchet.execution.envhost.RemotePolicy`) or, with ``trusted_rollouts = false``, the loaded module
    (:class:`ratchet.execution.worker.LocalPolicy`).

    Raises (every method): ``PolicyFailure`` (the policy raised, failed to load, lacks a function),
    ``RolloutAborted`` (its process died, timed out or sent garbage).

    Attributes:
        isolated: The policy runs in a process of its own (a trusted rollout's sandboxed policy process), so nothing
            it does reaches the task's side: what the task's own code raises there (an environment's ``reset`` or
            ``step``) is the task's fault. False in-process, where policy code could have tampered with it.
    """

    isolated: bool

    def start(self, params: Mapping[str, Any], seed: int, spaces: tuple[Any, Any] = (None, None)) -> None:
        """Begin an episode: load the policy, give it ``spaces`` (observation, action; None for none), seed
        its random generators with ``seed`` and call its ``reset(params, seed)`` if it has one."""

    def act(self, observation: Any, params: Mapping[str, Any]) -> Any:
        """The policy's ``act(observation, params)``."""

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        """The policy's ``name(*args, params)`` with the parameters ``start`` was given: a number, a numeric
        array, tuples/lists/dicts of them, or an ``Opaque`` stand-in for anything else."""

    def task_clock(self, what: str) -> AbstractContextManager[None]:
        """A context in which time is charged to whoever uses it: the policy's ``start`` (loading its module, its
        ``reset``), ``act`` and ``call`` run on the policy's clock, the caller's own code (the task's: an
        evaluator's, between its calls) on a clock of its own; each has the episode's time limit. The policy's
        clock running out is its failure (``RolloutAborted("timeout")``); the task's is the task's fault (the same,
        with ``fault`` set); ``what`` names the task's code in a line, for a process that dies while it runs. Where
        the episode is timed from outside (an in-process policy: one limit for the whole episode, and running out
        is the policy's failure), nothing."""


@runtime_checkable
class Task(Protocol):
    """One episode of a task and how it is judged. Must be picklable (workers receive it) and JSON-describable
    (:meth:`to_dict` is stored in the ledger; :func:`task_from_dict` rebuilds it). Its attributes are read-only
    properties here, so a frozen dataclass's fields (or a class attribute, for ``kind``) implement them.
    """

    @property
    def kind(self) -> str:
        """Its key in :data:`TASK_KINDS` (a class attribute will do)."""

    @property
    def action_mode(self) -> str:
        """``"error"``: an invalid action ends the episode as an error; ``"clip"``: clip it."""

    @property
    def success_threshold(self) -> float | None:
        """An episode succeeds when its return is at least this; None: no success defined."""

    @property
    def name(self) -> str:
        """What people and prompts call the task (``"LunarLander-v3"``)."""

    @property
    def step_limit(self) -> int | None:
        """Most steps one episode can take, in the task's cost unit (env steps), or None for no limit."""

    @property
    def functions(self) -> Mapping[str, int]:
        """The functions a policy file defines for this task, with their argument counts (``params`` last):
        ``{"act": 2}`` for an environment."""

    @property
    def cost_unit(self) -> str:
        """What an episode's length (and the ``env_steps`` budget) counts: ``"env steps"``, ``"instances"``..."""

    @property
    def episode_unit(self) -> str:
        """What people call one of its episodes, plural: ``"episodes"``, an evaluator's ``"instances"`` (a class
        attribute will do: displays of a recorded run read it from :func:`kind_class`)."""

    @property
    def return_name(self) -> str:
        """What people call an episode's return: ``"return"``, an evaluator's ``"score"`` (a class attribute)."""

    def seed_pools(self) -> Mapping[str, Sequence[int]] | None:
        """The seeds each split may use when they are a fixed set (a data set's instances), else None."""

    def private_paths(self) -> Sequence[str]:
        """Folders of the trusted side that policy code must not read (an evaluator's folder: its data sets and
        reference solutions); executors hide them from sandboxed workers where the sandbox can."""

    def opponent_sources(self) -> Mapping[str, str]:
        """Policy code the task runs beside the candidate (a game's opponents), source by its SHA-256; empty for
        none. Executors run it sandboxed, like the candidate, and pass ``opponents=`` (a
        :class:`~ratchet.tasks.game.OpponentHandles`, which also keeps the players' clocks) to :meth:`run_episode`
        when it is not empty; such an episode may then last one ``episode_timeout_s`` per player (two)."""

    def after_promotion(self, incumbent: Any,
                        payoffs: Mapping[str, Mapping[str, float]]) -> tuple[Task, dict[str, Any]]:
        """The task once ``incumbent`` (a :class:`~ratchet.policy.Candidate`: the start policy when the run starts,
        then each one a promotion puts in place) holds the incumbency, and JSON-ready notes on the change:
        ``(self, {})`` unless the task grows with the run (a game's self-play league adds it to the training
        opponents; its notes are the payoff table and meta-strategy). ``payoffs``: each incumbent's mean training
        return per opponent, by candidate id (empty for tasks without opponents). The loop records a changed task
        with its notes (``task_updated``) and evaluates with it from then on."""

    @property
    def changes_on_promotion(self) -> bool:
        """Whether :meth:`after_promotion` may return another task (a game's self-play league) or :meth:`rival_seeds`
        grow with the incumbents: work planned before a promotion would then run on the wrong task (``[planner]
        overlap_gate`` is off for it). A class attribute or property."""

    def rival_seeds(self) -> Mapping[str, Sequence[int]]:
        """Seeds of the games a candidate the gate would promote must not lose, by rival (a game league's members:
        the run's incumbents so far). The loop runs them (recorded as split ``"league"``, charged as validation)
        and refuses the candidate when its mean return against any rival is below 0 (zero-sum payoffs: it loses to
        that rival). Empty: no such check."""

    @property
    def deterministic(self) -> bool:
        """Whether the task declares its score deterministic (``[task] deterministic``): a candidate scores the same
        on every seed and every time it is evaluated, so each distinct candidate is scored once and the gate
        promotes a strict improvement confirmed by one exact re-evaluation (``[planner] decide = "exact"``,
        :mod:`ratchet.deciders.exact`); training seeds are then the same every generation. False for a task
        whose kind cannot declare it (a class attribute will do)."""

    @property
    def batched_rollouts(self) -> bool:
        """Whether the task also implements :class:`BatchedRollouts` (several episodes of one policy stepped at once;
        a class attribute will do): executors with trusted rollouts then call its ``run_batch``, else
        :meth:`run_episode` one episode at a time."""

    @property
    def records_transitions(self) -> bool:
        """Whether :meth:`run_episode` records the episode's transitions to a ``.npz`` ``render_path``
        (:mod:`ratchet.worldmodel.transitions`: an environment stepped on the trusted side), the data ``[model]
        screen`` learns its world model from; without them the screen never has the transitions it needs. A class
        attribute will do."""

    def run_episode(self, policy: PolicyHandle, params: Mapping[str, Any], seed: int,
                    render_path: str | None = None) -> Any:
        """One episode on the trusted side (the env host): the :class:`~ratchet.rollout.Episode` of ``policy``
        with ``params`` on ``seed``, recorded to ``render_path`` where the task can record.

        Raises:
            RolloutAborted: the policy process died, timed out or sent garbage (the executor's business);
                every failure of the policy itself is an errored episode instead.
        """

    def make_env(self, render_mode: str | None = None) -> Any:
        """A fresh Gymnasium-style environment (made on the trusted side: the env host).

        Raises:
            TaskError: it cannot be made (or the task has no environment).
        """

    def spaces(self) -> tuple[Any, Any]:
        """``(observation_space, action_space)``.

        Raises:
            TaskError: the environment cannot be made.
        """

    def dims(self) -> dict[str, int]:
        """The sizes a policy's array shapes may name (``{"obs": n, "act": m}``).

        Raises:
            TaskError: the environment cannot be made.
        """

    def is_success(self, episode_return: float, terminated: bool, truncated: bool) -> bool | None:
        """Whether an episode succeeded; None when the task defines no success."""

    def success_rule(self) -> str | None:
        """How success is decided, for people, with where its threshold comes from; None without one."""

    @property
    def diagnose(self) -> Callable[[Any], list[str]] | None:
        """The task's failure diagnoser (``Episode -> [label, ...]``), or None (the critic clusters)."""

    def observation_names(self, size: int) -> list[str]:
        """Readable names of the ``size`` observation components."""

    def describe(self) -> str | None:
        """How the task rewards and ends an episode, for a prompt; None when unknown."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description with ``"kind"`` (stored in the ledger)."""


class BatchedRollouts(Protocol):
    """The optional part of the :class:`Task` contract a task with ``batched_rollouts = True`` implements."""

    def run_batch(self, policy: Any, params: Mapping[str, Any], seeds: Sequence[int], width: int,
                  timeout_s: float) -> list[Any]:
        """The :class:`~ratchet.rollout.Episode` of ``policy`` with ``params`` on each of ``seeds``, in order, up to
        ``width`` environments stepped in lockstep (one message to the policy process per round), each equal to its
        :meth:`Task.run_episode`; ``timeout_s``: per-episode time limit (seconds). ``policy`` is a batch handle
        (:class:`ratchet.execution.envhost.RemotePolicy`)."""


def kind_class(kind: Any) -> Any:
    """The task class registered as ``kind`` in :data:`TASK_KINDS`.

    Raises:
        TaskError: no such kind.
    """
    if kind not in TASK_KINDS:
        raise TaskError(f"unknown task kind {kind!r}; known: {', '.join(TASK_KINDS)}")
    module, _, cls = TASK_KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), cls)


def task_from_spec(table: Any) -> Task:
    """The task a run spec's ``[task]`` table describes (a :class:`~ratchet.spec.TaskSpec` or its dict form, as
    the ledger stores it; without ``kind``: ``"gym"``).

    Raises:
        TaskError: unknown kind, or the kind refuses the table (e.g. an unregistered env id).
    """
    t = table if isinstance(table, Mapping) else table.model_dump()
    task: Task = kind_class(t.get("kind") or "gym").from_spec(t)
    return task


def success_rule_of(recorded: Mapping[str, Any] | None, spec_table: Any = None) -> str | None:
    """:meth:`Task.success_rule` of a task as a run recorded it (:meth:`Task.to_dict`), else of a spec's ``[task]``
    table (a run recorded before its task was), or None: it defines no success, or it cannot be rebuilt here (a
    display never fails on it)."""
    try:
        built = task_from_dict(recorded) if recorded else task_from_spec(spec_table)
        return built.success_rule()
    except (TaskError, KeyError, TypeError, AttributeError, ValueError):
        return None


def task_from_dict(d: Mapping[str, Any]) -> Task:
    """Inverse of :meth:`Task.to_dict` (a dict without ``kind`` is a ``"gym"`` task, as older ledgers wrote it).

    Raises:
        TaskError: unknown kind, or the kind refuses the dict.
    """
    task: Task = kind_class(d.get("kind") or "gym").from_dict(d)
    return task
