"""Gymnasium tasks: an episode is one ``reset(seed)`` and ``step`` loop of a registered environment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from ratchet.errors import TaskError
from ratchet.policy import space_dims

__all__ = ["GymTask", "gym_spec"]


@dataclass(frozen=True)
class GymTask:
    """Any registered Gymnasium environment.

    Args:
        env_id: A registered id such as ``"LunarLander-v3"``.
        env_kwargs: Keyword arguments for ``gymnasium.make``.
        success_threshold: An episode succeeds when its return is ``>=`` this. ``None`` uses the env's
            registered ``reward_threshold`` (and no success at all when the env has none).
        action_mode: ``"error"`` (default): an invalid action ends the episode as an error; ``"clip"``: clip it
            into the action space.
        max_episode_steps: Override the registered time limit (env steps); ``None`` keeps it. A
            ``max_episode_steps`` in ``env_kwargs`` (how tasks recorded by older versions set it) is moved
            here, so :attr:`step_limit` is always the limit episodes really have.
        description: What an episode's rewards and ending are, in words (``[task] description``), for
            :meth:`describe`; None takes them from the environment's documentation.
        threshold_registered: Whether ``success_threshold`` is the env's registered ``reward_threshold`` (True) or
            the user's (False), for :meth:`success_rule`; None (the default) decides from ``success_threshold``:
            True when it is None and filled in from the registry, else False.
        deterministic: ``[task] deterministic``: every episode of a policy returns the same, whatever its seed
            (an environment whose reset ignores the seed), so each candidate is scored once
            (:attr:`ratchet.tasks.Task.deterministic`).

    Raises:
        TaskError: the id is not registered (the message lists close matches), ``env_kwargs`` and
            ``max_episode_steps`` set two different time limits, or the environment cannot be made with
            these keyword arguments.
    """

    kind: ClassVar[str] = "gym"
    episode_unit: ClassVar[str] = "episodes"
    return_name: ClassVar[str] = "return"
    batched_rollouts: ClassVar[bool] = True  # run_batch: several episodes of one policy stepped at once (lockstep)
    changes_on_promotion: ClassVar[bool] = False  # an environment does not change with the run
    records_transitions: ClassVar[bool] = True  # run_episode writes an .npz render path's transitions

    env_id: str
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    success_threshold: float | None = None
    action_mode: str = "error"
    max_episode_steps: int | None = None
    description: str | None = None
    threshold_registered: bool | None = field(default=None, compare=False)
    deterministic: bool = False

    def __post_init__(self) -> None:
        if self.action_mode not in ("error", "clip"):
            raise TaskError(f"action_mode must be \"error\" or \"clip\", got {self.action_mode!r}")
        spec = gym_spec(self.env_id)
        registered = self.success_threshold is None and spec.reward_threshold is not None
        if registered:
            object.__setattr__(self, "success_threshold", float(spec.reward_threshold))
        if self.threshold_registered is None:
            object.__setattr__(self, "threshold_registered", registered)
        kwargs = dict(self.env_kwargs)
        if "max_episode_steps" in kwargs:
            limit = kwargs.pop("max_episode_steps")
            if self.max_episode_steps is not None and limit != self.max_episode_steps:
                raise TaskError(f"two time limits: env_kwargs max_episode_steps = {limit!r} and max_episode_steps = "
                                f"{self.max_episode_steps!r}; keep only max_episode_steps")
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise TaskError(f"max_episode_steps must be a positive int (env steps), got {limit!r}")
            object.__setattr__(self, "max_episode_steps", limit)
        object.__setattr__(self, "env_kwargs", kwargs)

    @property
    def step_limit(self) -> int | None:
        """Most env steps an episode can take (the time limit, env steps), or None when the env has none.

        ``max_episode_steps`` when set, else the registered ``max_episode_steps`` of the env id. A run
        refuses an env without one (see :class:`ratchet.spec.TaskSpec`): its budget could not be a hard cap.
        """
        if self.max_episode_steps is not None:
            return int(self.max_episode_steps)
        limit = gym_spec(self.env_id).max_episode_steps
        return None if limit is None else int(limit)

    @property
    def name(self) -> str:
        """The env id."""
        return self.env_id

    #: A policy defines ``act(observation, params)`` (two arguments).
    functions: ClassVar[Mapping[str, int]] = {"act": 2}
    #: An episode's length counts env steps.
    cost_unit: ClassVar[str] = "env steps"

    def seed_pools(self) -> Mapping[str, Sequence[int]] | None:
        """None: any seed makes an episode."""
        return None

    def private_paths(self) -> Sequence[str]:
        """None: the environment is a library, and its files hold nothing a policy could use to forge a return."""
        return ()

    def rival_seeds(self) -> dict[str, list[int]]:
        """``{}``: a Gymnasium environment has no rivals."""
        return {}

    def after_promotion(self, incumbent: Any, payoffs: Mapping[str, Mapping[str, float]]) -> tuple[Self, dict[str, Any]]:
        """Itself, no notes: a Gymnasium environment does not change with the run."""
        return self, {}

    def opponent_sources(self) -> dict[str, str]:
        """``{}``: a single-agent environment has no opponents."""
        return {}

    def run_episode(self, policy: Any, params: Mapping[str, Any], seed: int, render_path: str | None = None) -> Any:
        """One episode in a fresh environment (made here, on the trusted side), recorded to ``render_path`` when
        given (frames or a trace, :func:`ratchet.tasks.recording.record_episode`).

        Args:
            policy: The candidate (:class:`ratchet.tasks.PolicyHandle`), started with the env's spaces.
            params: Its parameter values.
            seed: The episode's seed (``env.reset(seed=seed)``).
            render_path: A ``.gif``/``.mp4``/``.json`` file to record to, or None.

        Returns:
            The :class:`~ratchet.rollout.Episode` (:func:`ratchet.rollout.run_episode`). With an isolated policy
            (``policy.isolated``: a trusted rollout) what the environment raises, made, reset or stepped, is the
            task's fault (:func:`ratchet.rollout.env_fault`: the run stops), not the policy's error.

        Raises:
            RolloutAborted: the policy process died, timed out or sent garbage.
        """
        from ratchet.rollout import EnvFailure, env_fault, guard_env, run_episode
        from ratchet.trace import render_mode_for

        def make() -> Any:
            return self.make_env(render_mode=render_mode_for(render_path))  # a trace needs no frames

        # A fresh environment per episode: some envs keep state across reset() (BipedalWalker-v3's
        # Box2D world does), which would make a return depend on the episodes run before it.
        try:
            env = (guard_env(make, self.env_id) if policy.isolated else make)()
        except EnvFailure as exc:
            return env_fault(seed, 0, exc)
        try:
            spaces = (env.observation_space, env.action_space)
            started = _Started(policy, spaces)
            if render_path:
                from ratchet.tasks.recording import record_episode

                return record_episode(env, started, params, seed, self, render_path)
            return run_episode(env, policy.act, started.reset, params, seed, self)
        finally:
            try:
                env.close()
            except Exception:  # noqa: BLE001, S110 - closing is best effort: the episode's result is already known
                pass

    def run_batch(self, policy: Any, params: Mapping[str, Any], seeds: Sequence[int], width: int,
                  timeout_s: float) -> list[Any]:
        """The episodes of one candidate on ``seeds``, up to ``width`` environments stepped in lockstep (one message
        to the policy process per round; :func:`ratchet.rollout.run_lockstep`), each in a fresh environment and equal
        to its :meth:`run_episode`.

        Args:
            policy: A batch handle (:class:`ratchet.execution.envhost.RemotePolicy`).
            params: The candidate's parameter values.
            seeds: The episodes' seeds.
            width: Most environments at once.
            timeout_s: Per-episode time limit (seconds; each episode is charged its share of the rounds it was in).

        Returns:
            The :class:`~ratchet.rollout.Episode` of each seed, in order (an isolated policy's: what the environment
            raised is the task's fault, as in :meth:`run_episode`).

        Raises:
            BatchAborted: the policy process died, timed out or sent garbage.
        """
        from ratchet.rollout import guard_env, run_lockstep

        make = guard_env(self.make_env, self.env_id) if policy.isolated else self.make_env
        return run_lockstep(make, policy, params, list(seeds), self, width, timeout_s)

    def spaces(self) -> tuple[Any, Any]:
        """``(observation_space, action_space)`` of the environment (made once and closed; no policy code runs).

        Raises:
            TaskError: the environment cannot be made.
        """
        env = self.make_env()
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    def dims(self) -> dict[str, int]:
        """``{"obs": n, "act": m}`` (:func:`ratchet.policy.space_dims`) for policies whose array shapes name them.

        Raises:
            TaskError: the environment cannot be made.
        """
        return space_dims(*self.spaces())

    def make_env(self, render_mode: str | None = None) -> Any:
        """Make the environment (``gymnasium.make``) with this task's keyword arguments."""
        import gymnasium as gym

        kwargs = dict(self.env_kwargs)
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        if self.max_episode_steps is not None:
            kwargs["max_episode_steps"] = self.max_episode_steps
        try:
            return gym.make(self.env_id, **kwargs)
        except Exception as exc:  # noqa: BLE001 - gymnasium raises many types here (DependencyNotInstalled, TypeError, ...)
            text = " ".join(str(exc).split())[:300]
            raise TaskError(f"cannot make {self.env_id} with env_kwargs {dict(self.env_kwargs)}: {text}") from None

    def is_success(self, episode_return: float, terminated: bool, truncated: bool) -> bool | None:
        """``episode_return >= success_threshold``; ``None`` when there is no threshold."""
        if self.success_threshold is None:
            return None
        return bool(episode_return >= self.success_threshold)

    def success_rule(self) -> str | None:
        """How :meth:`is_success` decides, for people, with the threshold's source: ``"return ≥ -110
        (MountainCar-v0's registered reward_threshold)"`` or ``"return ≥ 200 ([task] success_threshold)"``;
        None when there is no threshold."""
        if self.success_threshold is None:
            return None
        source = (f"{self.env_id}'s registered reward_threshold" if self.threshold_registered
                  else "[task] success_threshold")
        return f"return ≥ {self.success_threshold:g} ({source})"

    @property
    def diagnose(self) -> Any:
        """The shipped failure diagnoser for this env (``Episode -> list[str]``), or None.

        See :mod:`ratchet.diagnosers` (LunarLander, CartPole, BipedalWalker, MountainCar).
        """
        from ratchet.diagnosers import diagnoser_for

        return diagnoser_for(self.env_id)

    def observation_names(self, size: int) -> list[str]:
        """Readable names for the ``size`` observation components."""
        from ratchet.diagnosers import observation_names

        return observation_names(self.env_id, size)

    def describe(self, env: Any = None) -> str | None:
        """The task's rewards and episode end in words (for LLM prompts): :attr:`description` when set, else
        the *Rewards* and *Episode End* (or *Termination*, *Truncation*) sections of the environment class's
        docstring, as Gymnasium documents its environments (at most 1,500 characters), else None.

        Args:
            env: An environment of this task already made (None makes one; no policy code runs).
        """
        if self.description:
            return self.description.strip()
        own = env is None
        try:
            env = self.make_env() if own else env
            doc = type(env.unwrapped).__doc__ or ""
        except Exception:  # noqa: BLE001 - a description is optional
            return None
        finally:
            if own and env is not None:
                try:
                    env.close()
                except Exception:  # noqa: BLE001, S110 - closing an env made only for its description is best effort
                    pass
        return doc_sections(doc)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (``description`` only when set)."""
        return {"kind": "gym", "env_id": self.env_id, "env_kwargs": dict(self.env_kwargs),
                "success_threshold": self.success_threshold, "action_mode": self.action_mode,
                "max_episode_steps": self.max_episode_steps, "threshold_registered": self.threshold_registered,
                **({"description": self.description} if self.description else {}),
                **({"deterministic": True} if self.deterministic else {})}

    @classmethod
    def from_spec(cls, task: Any) -> GymTask:
        """Build from a run spec's ``[task]`` table (a :class:`~ratchet.spec.TaskSpec` or its dict form,
        as stored in the ledger)."""
        t = task if isinstance(task, Mapping) else task.model_dump()
        return cls(t["env_id"], t.get("env_kwargs", {}), t.get("success_threshold"), t.get("action", "error"),
                   t.get("max_episode_steps"), t.get("description"), deterministic=bool(t.get("deterministic")))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GymTask:
        """Inverse of :meth:`to_dict`. A task recorded before ``threshold_registered`` was kept counts its threshold as
        registered when it equals the env's registered ``reward_threshold``."""
        threshold, registered = d.get("success_threshold"), d.get("threshold_registered")
        if registered is None and threshold is not None:
            reward_threshold = gym_spec(d["env_id"]).reward_threshold
            registered = reward_threshold is not None and float(reward_threshold) == float(threshold)
        return cls(d["env_id"], d.get("env_kwargs", {}), threshold, d.get("action_mode", "error"),
                   d.get("max_episode_steps"), d.get("description"), registered, bool(d.get("deterministic")))


class _Started:
    """A policy handle seen as ``run_episode`` wants it: ``reset(params, seed)`` starts it with the env's spaces."""

    def __init__(self, policy: Any, spaces: tuple[Any, Any]) -> None:
        self.policy, self.spaces = policy, spaces
        self.act = policy.act

    def reset(self, params: Any, seed: int) -> None:
        self.policy.start(params, seed, self.spaces)


def doc_sections(doc: str, max_chars: int = 1500) -> str | None:
    """The *Rewards* and *Episode End* sections of a Gymnasium environment's docstring (headings such as
    ``## Rewards``, ``## Reward:``, ``## Episode End``, ``## Episode Termination``, ``## Episode Truncation``),
    whitespace collapsed and RST markup (````x````, ``:math:`x```) reduced to its text; None when it has neither.

    Args:
        doc: The docstring.
        max_chars: Most characters returned (cut with ``…``).
    """
    import re

    parts = re.split(r"^[ \t]*#{1,6}[ \t]*(.+?)[ \t]*$", doc, flags=re.MULTILINE)
    found = []
    for head, body in zip(parts[1::2], parts[2::2]):
        title = head.strip().rstrip(":")
        if re.match(r"(rewards?|episode (end|termination|truncation)|termination)$", title, re.IGNORECASE):
            text = re.sub(r":\w+:`([^`]*)`", r"\1", body)
            text = " ".join(text.replace("``", "").split())
            if text:
                found.append(f"{title}: {text}")
    if not found:
        return None
    out = "\n".join(found)
    return out if len(out) <= max_chars else out[:max_chars - 1].rstrip() + "…"


def gym_spec(env_id: str) -> Any:
    """Look up a Gymnasium registration, with a helpful error.

    Raises:
        TaskError: the id is not registered.
    """
    import difflib

    import gymnasium as gym

    if not isinstance(env_id, str) or not env_id:
        raise TaskError("env id is empty; set [task] env_id, e.g. \"CartPole-v1\"")
    if ":" in env_id:  # Gymnasium's "module:EnvId": importing the module registers its envs
        import importlib

        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise TaskError(f"env id {module}:{env_id} needs the module {module!r}, which cannot be imported "
                            f"({exc}); install the package that provides it (e.g. pip install {module})") from None
    try:
        return gym.spec(env_id)
    except gym.error.Error:  # NameNotFound, VersionNotFound, a malformed id, ...
        close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; run `python -c \"import gymnasium; print(list(gymnasium.registry))\"` to list ids"
        raise TaskError(f"unknown Gymnasium env id {env_id!r}{hint}") from None
