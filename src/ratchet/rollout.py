"""One episode: seeded, deterministic, no I/O. Also the :class:`Episode` record."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["LOCKSTEP_EPISODES", "BatchAborted", "EnvFailure", "Episode", "Opaque", "PolicyFailure", "RolloutAborted", "action_checker",
           "check_action", "env_fault", "error_text", "guard_env", "run_episode", "run_lockstep"]


#: An episode's diagnostics key, set by the executor (never taken from a worker's reply): env steps of attempts of
#: the episode that were lost and run again one at a time, counted by the trusted side (:attr:`Episode.env_steps`).
LOST_ENV_STEPS = "lost_env_steps"


@dataclass(frozen=True)
class Episode:
    """The outcome of one seeded episode.

    Attributes:
        seed: The seed passed to ``env.reset(seed=...)``.
        episode_return: Undiscounted sum of rewards (partial sum when the episode errored).
        length: Env steps taken.
        terminated: The task ended (Gymnasium ``terminated``).
        truncated: The time limit cut the episode (Gymnasium ``truncated``). Never merged with
            ``terminated``; both are False for an errored episode.
        success: Task-defined success (False for an errored episode), or None when the task
            defines no success.
        error: Why the episode failed (policy exception, invalid action, timeout, worker crash), or None.
        diagnostics: Task details: ``final_observation`` (list of float, at most 64 entries),
            ``final_reward`` (the last step's reward), ``cause`` (``"terminated"``, ``"truncated"`` or
            ``"error"``), ``lost_env_steps`` (:data:`LOST_ENV_STEPS`).
    """

    seed: int
    episode_return: float
    length: int
    terminated: bool
    truncated: bool
    success: bool | None = None
    error: str | None = None
    diagnostics: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def env_steps(self) -> int:
        """Env steps this episode cost the budget: its ``length`` plus the steps the trusted side counted in attempts
        of it that were lost and run again (``diagnostics[LOST_ENV_STEPS]``, set by the executor only: a lockstep
        attempt rerun one at a time, as its policy process may ask, and the attempts of an episode whose policy
        process died on each of them, ``death_retries``). A retry that succeeds leaves no trace (a worker killed from
        outside must not change the ledger): its lost attempt counts against the executor's cap only."""
        lost = self.diagnostics.get(LOST_ENV_STEPS, 0)
        return self.length + (lost if isinstance(lost, int) and not isinstance(lost, bool) and lost > 0 else 0)

    @property
    def timed_out(self) -> bool:
        """The time limit ended it and the task did not: ``truncated`` and not ``terminated``. Gymnasium sets both
        when the task ends on the limit's last step (a crash, a fall, the goal): that ending is the task's own."""
        return self.truncated and not self.terminated

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"seed": self.seed, "episode_return": self.episode_return, "length": self.length,
                "terminated": self.terminated, "truncated": self.truncated, "success": self.success,
                "error": self.error, "diagnostics": dict(self.diagnostics)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Episode:
        """Inverse of :meth:`to_dict`. A non-text ``error`` (ledgers written before replies were
        validated could hold one) is read as its ``str()``."""
        error = d["error"]
        return cls(**{k: d[k] for k in ("seed", "episode_return", "length", "terminated", "truncated", "success")},
                   error=error if error is None or isinstance(error, str) else str(error),
                   diagnostics=d.get("diagnostics", {}))

    @classmethod
    def failed(cls, seed: int, error: str, length: int = 0, episode_return: float = 0.0, task: Any = None) -> Episode:
        """An errored episode (used by executors for timeouts and crashes).

        ``success`` is False when ``task`` defines success (an error is a failure), else None.
        """
        return cls(seed, episode_return, length, False, False, _failure(task), error, {"cause": "error"})


def _failure(task: Any) -> bool | None:
    """The ``success`` value of an errored episode: False if the task defines success, else None."""
    if task is None:
        return None
    return None if task.is_success(0.0, False, False) is None else False


class PolicyFailure(Exception):
    """The policy failed in its own process (raised, failed to load, has no ``act``), as reported to
    the trusted env host; :func:`run_episode` records it as the episode's error.

    Attributes:
        kind: The error's prefix, e.g. ``"policy raised ValueError"``.
        text: Its message (untrusted text).
        start: It failed starting the episode (loading, ``reset``), before the environment's first observation. The
            policy process says so, so it is only a claim: :func:`run_lockstep` believes it only for an episode that
            has not taken an env step yet; after one, the failure counts the steps and return the env host counted.
    """

    def __init__(self, kind: str, text: str = "", start: bool = False) -> None:
        super().__init__(f"{kind}: {text}" if text else kind)
        self.kind, self.text, self.start = kind, text, start


class Opaque:
    """An answer of the policy that is not a number or a numeric array (None, a string, an object): only its
    type name and a short repr cross the boundary from the sandbox; every action check rejects it."""

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text


class RolloutAborted(Exception):
    """Raised by a remote policy when its process is lost (died, timed out, sent garbage): not an
    answer of the policy but the executor's business. :func:`run_episode` attaches what the episode
    had reached (``length`` in env steps, ``episode_return``, ``final_observation``) and re-raises.

    Attributes:
        status: ``"died"``, ``"timeout"``, ``"interfered"``, or ``"solo"`` (a lockstep round outlasted the time
            left, or the policy process answered that its episodes must run one at a time: run them again so).
        detail: A short description (for ``"interfered"``: what was sent).
    """

    def __init__(self, status: str, detail: str = "") -> None:
        super().__init__(f"{status}: {detail}" if detail else status)
        self.status, self.detail = status, detail
        self.length, self.episode_return = 0, 0.0
        self.final_observation: list[float] | None = None
        #: Set by a task when the time ran out in its own code, not the policy's: why, in one line.
        self.fault: str | None = None
        #: Set by a task when the episode is decided all the same (a game's opponent whose process was lost forfeits
        #: it): the episode to record; the process is replaced as after any loss.
        self.episode: Episode | None = None


class EnvFailure(Exception):
    """The environment itself raised, in a process policy code cannot reach (a trusted rollout's env host; see
    :func:`guard_env`): the task's fault, not the policy's. :func:`run_episode` and :func:`run_lockstep` give such an
    episode as the task's fault (:func:`env_fault`), never as the policy's error.

    Attributes:
        env: The environment's id (``[task] env_id``).
        call: What raised: ``"make"`` (making it), ``"reset"``, ``"step"`` or ``"render"``.
        kind: The type of what it raised: its name for a built-in exception, else with its module (``pygame.error``).
        text: Its message (at most 300 characters).
    """

    def __init__(self, env: str, call: str, exc: BaseException) -> None:
        kind = type(exc)
        self.env, self.call, self.text = env, call, _text_of(exc)
        self.kind = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        super().__init__(f"{env} raised {self.kind} in {call}: {self.text}")


class _GuardedEnv:
    """An environment whose ``reset``, ``step`` and ``render`` raise :class:`EnvFailure` for whatever it raises (a
    timer's :class:`RolloutAborted` passes through: the episode's time is not the env's fault here)."""

    def __init__(self, env: Any, name: str) -> None:
        self.env, self.name = env, name
        self.action_space, self.observation_space = env.action_space, env.observation_space

    def _call(self, call: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RolloutAborted:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the env raises is the env's
            raise EnvFailure(self.name, call, exc) from None

    def reset(self, **kwargs: Any) -> Any:
        return self._call("reset", self.env.reset, **kwargs)

    def step(self, action: Any) -> Any:
        return self._call("step", self.env.step, action)

    def render(self) -> Any:
        return self._call("render", self.env.render)

    def close(self) -> None:
        self.env.close()


def guard_env(make_env: Any, name: str) -> Any:
    """``make_env`` (``() -> env``) made into one whose environments raise :class:`EnvFailure` for what they raise in
    ``reset``, ``step`` or ``render`` (and itself for what making one raises), so :func:`run_episode` and
    :func:`run_lockstep` give it as the task's fault. Only where policy code cannot reach the env (a trusted
    rollout's env host): in a process shared with policy code, the code could have tampered with the env, and what
    the env raises stays the episode's error.

    Args:
        make_env: Makes a fresh environment.
        name: The environment's id, for the fault's line.
    """

    def make() -> Any:
        try:
            env = make_env()
        except RolloutAborted:
            raise
        except Exception as exc:  # noqa: BLE001 - gymnasium.make raises many types
            raise EnvFailure(name, "make", exc) from None
        return _GuardedEnv(env, name)

    return make


def env_fault(seed: int, steps: int, exc: EnvFailure) -> Episode:
    """The episode the environment failed (:class:`EnvFailure`) after ``steps`` env steps: the task's fault
    (``diagnostics["fault"] == "task"``, as an evaluator's own failure; the run stops on it), not the policy's. Its
    error is one line naming the seed, the step, the env and what it raised, e.g. ``environment error on seed 3 after
    4 steps: CartPole-v1 raised RuntimeError in env.step(): ...``."""
    where = {"make": "making it", "reset": "at reset"}.get(exc.call, f"after {steps} steps")
    call = "gymnasium.make" if exc.call == "make" else f"env.{exc.call}()"
    text = " ".join(f"environment error on seed {seed} {where}: {exc.env} raised {exc.kind} in {call}: {exc.text}".split())
    return Episode(seed, 0.0, steps, False, False, None, text[:500], {"cause": "error", "fault": "task"})


class InvalidAction(ValueError):
    """Raised by :func:`check_action` for a non-finite or out-of-space action."""


def check_action(action: Any, space: Any, mode: str) -> Any:
    """Validate (or clip) an action for a Gymnasium ``Discrete`` or ``Box`` space.

    Args:
        action: What the policy returned.
        space: The env's action space.
        mode: ``"error"`` or ``"clip"``.

    Returns:
        The action converted to the space's type (int for Discrete, ``ndarray`` of the space's dtype
        and shape for Box).

    Raises:
        InvalidAction: the action is non-finite, has the wrong shape/type, or (mode ``"error"``) lies
            outside the space.
    """
    return action_checker(space, mode)(action)


def action_checker(space: Any, mode: str) -> Any:
    """Build the validating function :func:`check_action` applies, once per episode (it runs every step)."""
    if isinstance(space, spaces.Discrete):
        lo, hi = int(space.start), int(space.start + space.n - 1)

        def check_discrete(action: Any) -> int:
            if type(action) is int:  # fast path
                a = action
            else:
                if isinstance(action, np.ndarray) and action.shape == ():
                    action = action.item()
                if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
                    if isinstance(action, (float, np.floating)) and not math.isfinite(action):
                        raise InvalidAction(f"action is non-finite ({action!r})")
                    raise InvalidAction(f"expected an int action for Discrete({hi - lo + 1}), "
                                        f"got {type(action).__name__} {repr(action)[:60]}")
                a = int(action)
            if not lo <= a <= hi:
                if mode == "clip":
                    return min(hi, max(lo, a))
                raise InvalidAction(f"action {str(a)[:40]} outside Discrete range [{lo}, {hi}]")
            return a

        return check_discrete
    if isinstance(space, spaces.Box):
        shape, low, high, dtype = space.shape, space.low, space.high, space.dtype
        size = int(np.prod(shape))

        def check_box(action: Any) -> np.ndarray:
            if action is None or isinstance(action, (bool, np.bool_, str, bytes)):
                raise InvalidAction(f"expected a numeric array of shape {shape}, got {type(action).__name__}")
            try:
                arr = np.asarray(action, dtype=np.float64)
            except (TypeError, ValueError):
                raise InvalidAction(f"expected a numeric array of shape {shape}, got {type(action).__name__}") from None
            if arr.shape != shape:
                if arr.size != size:
                    raise InvalidAction(f"expected action shape {shape}, got {arr.shape}")
                arr = arr.reshape(shape)
            if not np.isfinite(arr).all():
                raise InvalidAction(f"action is non-finite ({arr.tolist()})")
            if (arr < low).any() or (arr > high).any():
                if mode != "clip":
                    raise InvalidAction(f"action {np.round(arr, 4).tolist()} outside bounds "
                                        f"[{low.tolist()}, {high.tolist()}] (clip it in the policy, or set [task] "
                                        "action = \"clip\" to clip every action into the space)")
                arr = np.clip(arr, low, high)
            return arr.astype(dtype)

        return check_box

    def check_other(action: Any) -> Any:
        if not space.contains(action):
            raise InvalidAction(f"action {action!r} not in {space}")
        return action

    return check_other


def _obs_list(obs: Any) -> list[float] | None:
    """The first 64 numbers of an observation, or None (no observation yet, not numeric, not finite)."""
    if obs is None:
        return None
    try:
        out = [float(x) for x in np.asarray(obs, dtype=np.float64).ravel()[:64]]
    except (TypeError, ValueError):
        return None
    return out if all(math.isfinite(x) for x in out) else None


def run_episode(env: Any, act: Any, reset: Any, params: Mapping[str, float], seed: int,
                task: Any) -> Episode:
    """Roll one episode of a compiled policy in ``env``.

    Seeds ``env.reset(seed=seed)`` and, for policies that draw random numbers, Python's ``random``
    and NumPy's global generator, so the same (policy, params, seed) always gives the same episode.

    Args:
        env: A Gymnasium environment (made by ``task.make_env``).
        act: The policy's ``act(observation, params)``.
        reset: The policy's optional ``reset(params, seed)``, or None.
        params: Parameter values (name -> float).
        seed: Episode seed.
        task: The :class:`~ratchet.task.Task` (action mode, success).

    Returns:
        The :class:`Episode`. Policy exceptions and invalid actions give an errored episode; they
        are not raised. So does what ``env`` raises, unless it is a guarded env (:func:`guard_env`, where policy
        code cannot reach it): then the episode is the task's fault (:func:`env_fault`).
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    params = dict(params)
    total, steps, reward = 0.0, 0, 0.0
    obs = None
    try:
        if reset is not None:
            reset(params, seed)
        obs, _ = env.reset(seed=seed)
        check = action_checker(env.action_space, task.action_mode)
        while True:
            try:
                action = check(act(obs, params))
            except InvalidAction as exc:
                raise InvalidAction(f"step {steps}: {exc}") from None
            obs, reward, terminated, truncated, _ = env.step(action)
            steps += 1
            total += float(reward)
            if terminated or truncated:
                break
    except RolloutAborted as exc:
        exc.length, exc.episode_return, exc.final_observation = steps, total, _obs_list(obs)
        raise
    except EnvFailure as exc:  # a guarded env's own failure (guard_env): the task's fault
        return env_fault(seed, steps, exc)
    except BaseException as exc:  # noqa: BLE001 - the policy's failure (even SystemExit/KeyboardInterrupt) is the episode's outcome
        return _errored(seed, total, steps, obs, error_text(exc), task)
    return _ended(seed, total, steps, obs, reward, terminated, truncated, task)


def policy_line(exc: BaseException) -> str:
    """Where in a policy's code ``exc`` was raised, for its episode's error: ``" (policy line N)"`` for the innermost
    frame of code :func:`ratchet.policy.compile_policy` compiled as ``"<policy>"``, else ``""`` (raised elsewhere,
    e.g. in NumPy called from no policy line)."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<policy>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (policy line {line})" if line is not None else ""


def error_text(exc: BaseException) -> str:
    """An episode's error for what the policy (or, stepping its action, the env) raised."""
    if isinstance(exc, PolicyFailure):
        return f"{exc.kind}: {exc.text[:400]}" if exc.text else exc.kind
    kind = "invalid action" if isinstance(exc, InvalidAction) else f"policy raised {type(exc).__name__}"
    try:
        text = str(exc)[:400]
    except Exception:  # noqa: BLE001 - a policy's exception may fail in __str__ too
        text = "<unprintable exception>"
    return f"{kind}: {text}{policy_line(exc)}"


def _text_of(exc: BaseException) -> str:
    try:
        return str(exc)[:300]
    except Exception:  # noqa: BLE001 - an exception may fail in __str__ too
        return "<unprintable>"


def _errored(seed: int, total: float, steps: int, obs: Any, error: str, task: Any) -> Episode:
    return Episode(seed, total, steps, False, False, _failure(task), error[:500],
                   {"cause": "error", "final_observation": _obs_list(obs)})


def _ended(seed: int, total: float, steps: int, obs: Any, reward: Any, terminated: Any, truncated: Any,
           task: Any) -> Episode:
    if not math.isfinite(total):
        return _errored(seed, total, steps, obs, "non-finite return", task)
    success = task.is_success(total, bool(terminated), bool(truncated))
    return Episode(seed, total, steps, bool(terminated), bool(truncated), success, None,
                   {"cause": "terminated" if terminated else "truncated", "final_observation": _obs_list(obs),
                    "final_reward": float(reward)})


#: Episodes of one candidate a worker steps at once by default (``[execution] lockstep_episodes``): wide enough that
#: the round trip to the policy process costs well under 1 µs per env step, measured in benchmarks/rollout_speed.py.
LOCKSTEP_EPISODES = 64


class BatchAborted(Exception):
    """A lockstep batch stopped because its policy process was lost (:func:`run_lockstep`).

    Attributes:
        cause: The :class:`RolloutAborted` (``status``: ``"died"``, ``"timeout"``, ``"interfered"``, ``"solo"``).
        episodes: Per seed of the batch, its :class:`Episode` when it had finished, else None.
        partial: Per unfinished seed's index, ``(env steps, partial return)`` it had reached (0, 0.0 if never started).
        culprit: With a ``"timeout"`` cause, the index of the one episode whose own answer ran out the time (a round
            that asked it alone), or None when the time ran out before any episode's round (loading the policy):
            the batch's other unfinished episodes did nothing wrong, and are to be run again one at a time (as after
            ``"solo"``), each for a result of its own.
    """

    def __init__(self, cause: RolloutAborted, episodes: list[Episode | None], partial: dict[int, tuple[int, float]],
                 culprit: int | None = None):
        super().__init__(str(cause))
        self.cause, self.episodes, self.partial, self.culprit = cause, episodes, partial, culprit


class _Running:
    """One episode of a lockstep batch, on the trusted side."""

    __slots__ = ("check", "env", "index", "obs", "reward", "seed", "steps", "total", "used")

    def __init__(self, index: int, seed: int, env: Any, check: Any) -> None:
        self.index, self.seed, self.env, self.check = index, seed, env, check
        self.obs: Any = None
        self.total, self.steps, self.reward, self.used = 0.0, 0, 0.0, 0.0


def run_lockstep(make_env: Any, policy: Any, params: Mapping[str, Any], seeds: list[int], task: Any, width: int,
                 timeout_s: float) -> list[Episode]:
    """Roll the episodes of one candidate on ``seeds`` in lockstep: up to ``width`` environments at once, each
    round one message with the observations of the episodes waiting for an action and one answer with all their
    actions (:mod:`ratchet.execution.protocol`). Each episode has a fresh environment, is seeded and started
    afresh, and ends on its own (terminated, truncated or errored): its :class:`Episode` is the one
    :func:`run_episode` gives it alone.

    Time: each episode is charged its own reset and steps plus an equal share of every round it was in; an
    episode charged more than ``timeout_s`` ends the batch, and so does an answer that does not come within
    ``timeout_s`` less the time the round's most-charged episode has used (so a hanging policy is stopped as soon
    as one of its episodes runs out): as that episode's timeout when the round asked it alone, else as ``"solo"``
    (see Raises). Rounds start with one observation and double while the
    policy's answers would take under a tenth of ``timeout_s``, so a slow policy is never timed out for
    answering many observations at once.

    Args:
        make_env: ``() -> env``: a fresh environment (the task's ``make_env``).
        policy: A batch handle (:class:`ratchet.execution.envhost.RemotePolicy`): ``start_batch(params, spaces)``
            returns the most episodes the policy serves at once; ``act_round(new, done, slots, observations,
            timeout_s)`` answers a round.
        params: The candidate's parameter values.
        seeds: The episodes' seeds (``env.reset(seed=...)``), in the order of the returned list.
        task: The task (action mode, success).
        width: Most episodes at once (≥ 1).
        timeout_s: Per-episode time limit, seconds.

    Returns:
        One :class:`Episode` per seed, in ``seeds`` order.

    Raises:
        BatchAborted: the policy process died, timed out or sent garbage; it carries the finished episodes and
            how far the others got. A round of one answer that outlasts its episode's time is that episode's timeout
            (:attr:`BatchAborted.culprit`); the other unfinished episodes run again one at a time. Its cause's status
            is ``"solo"`` when a round of several answers outlasted the time left (or took an episode's charge past
            it), or the policy process answered that its episodes must run one at a time
            (:data:`ratchet.execution.protocol.ONE_AT_A_TIME`: policy code changed the global random generators
            with several running): the unfinished episodes are then to be run again one at a time, where a policy
            that is merely slow gets each episode's own timeout (and one that hangs times out as it would alone)
            and each draws from generators seeded for it alone.

    An environment from a guarded ``make_env`` (:func:`guard_env`) that raises (made, reset or stepped) gives its
    episode as the task's fault (:func:`env_fault`), the others going on.

    A failure the policy process claims for an episode's start (:attr:`PolicyFailure.start`) is believed only before
    the episode's first env step; after it, the episode keeps the env steps and return counted here.
    """
    import time

    clock = time.perf_counter
    done: list[Episode | None] = [None] * len(seeds)
    running: dict[int, _Running] = {}
    culprit: int | None = None  # the episode whose own answer ran out the time (BatchAborted.culprit)
    try:
        first_env = make_env()
    except EnvFailure as exc:  # a guarded env (guard_env) that cannot be made: the task's fault, on every seed
        return [env_fault(s, 0, exc) for s in seeds]
    envs_made = [first_env]
    try:
        spaces = (first_env.observation_space, first_env.action_space)
        t0 = clock()
        try:
            width = max(1, min(width, int(policy.start_batch(params, spaces))))
        except PolicyFailure as exc:
            return [_errored(s, 0.0, 0, None, error_text(exc), task) for s in seeds]
        start_cost = (clock() - t0) / max(1, min(width, len(seeds)))
        queue: list[int] = []  # slots waiting for an action, in order
        new: dict[int, int] = {}  # slots whose episode the policy has not started yet -> seed
        ended: list[int] = []  # slots whose episode ended since the last round (the policy drops their state)
        next_i, chunk = 0, 1
        while True:
            while len(running) < width and next_i < len(seeds):  # refill: fresh episodes into free places
                i, seed = next_i, seeds[next_i]
                next_i += 1
                t = clock()
                try:
                    env = envs_made.pop() if envs_made else make_env()
                except EnvFailure as exc:
                    done[i] = env_fault(seed, 0, exc)
                    continue
                except Exception as exc:  # noqa: BLE001 - as alone: the env cannot be made for this episode
                    done[i] = Episode.failed(seed, f"worker error: {type(exc).__name__}: {_text_of(exc)}"[:500], task=task)
                    continue
                run = _Running(i, seed, env, action_checker(env.action_space, task.action_mode))
                random.seed(seed)  # as run_episode: an env drawing from the global generators draws the same
                np.random.seed(seed % 2**32)
                try:
                    run.obs, _ = env.reset(seed=seed)
                except EnvFailure as exc:  # as run_episode: a guarded env's own failure is the task's fault
                    done[i] = env_fault(seed, 0, exc)
                    _retire(env)
                    continue
                except Exception as exc:  # noqa: BLE001 - as run_episode: the episode's error
                    done[i] = _errored(seed, 0.0, 0, None, error_text(exc), task)
                    _retire(env)
                    continue
                run.used = start_cost + clock() - t
                running[i] = run
                new[i] = seed
                queue.append(i)
            if not queue:
                break
            slots, queue = queue[:chunk], queue[chunk:]
            runs = [running[i] for i in slots]
            left = timeout_s - max(r.used for r in runs)
            t = clock()
            try:
                answers = policy.act_round([(i, new.pop(i)) for i in slots if i in new], ended, slots,
                                           [r.obs for r in runs], max(left, 1e-3))
            except PolicyFailure as exc:  # the policy failed the whole round (act_batch raised): each episode's error
                answers = [exc] * len(slots)
            except RolloutAborted as exc:
                if exc.status == "timeout" and len(slots) > 1:  # many answers outlasted one episode's time
                    raise RolloutAborted("solo", f"a round of {len(slots)} answers took over {left:.3g} s") from None
                if exc.status == "timeout":  # one answer: that episode's own, the others did nothing wrong
                    culprit = slots[0]
                raise
            ended = []
            answered = clock() - t
            for r, answer in zip(runs, answers):
                if isinstance(answer, PolicyFailure) and answer.start and r.steps == 0:  # as run_episode: at reset
                    done[r.index] = _errored(r.seed, 0.0, 0, None, error_text(answer), task)
                    _retire(running.pop(r.index).env)
                    ended.append(r.index)
                    continue
                try:
                    if isinstance(answer, PolicyFailure):
                        raise answer
                    if isinstance(answer, Opaque):
                        raise InvalidAction(f"expected a number or a numeric array, got {answer.type_name} {answer.text}")
                    try:
                        action = r.check(answer)
                    except InvalidAction as exc:
                        raise InvalidAction(f"step {r.steps}: {exc}") from None
                    r.obs, r.reward, terminated, truncated, _ = r.env.step(action)
                    r.steps += 1
                    r.total += float(r.reward)
                except RolloutAborted:
                    raise
                except EnvFailure as exc:  # as run_episode: a guarded env's own failure is the task's fault
                    done[r.index] = env_fault(r.seed, r.steps, exc)
                    _retire(running.pop(r.index).env)
                    ended.append(r.index)
                    continue
                except BaseException as exc:  # noqa: BLE001 - as run_episode: the policy's failure is the episode's outcome
                    done[r.index] = _errored(r.seed, r.total, r.steps, r.obs, error_text(exc), task)
                    _retire(running.pop(r.index).env)
                    ended.append(r.index)
                    continue
                if terminated or truncated:
                    done[r.index] = _ended(r.seed, r.total, r.steps, r.obs, r.reward, terminated, truncated, task)
                    _retire(running.pop(r.index).env)
                    ended.append(r.index)
                else:
                    queue.append(r.index)
            share = (clock() - t) / len(runs)
            for r in runs:
                r.used += share
                if r.used > timeout_s and r.index in running:
                    if len(runs) > 1:  # its share of a round of many: whose time it was is not known
                        raise RolloutAborted("solo", f"a round of {len(runs)} answers took seed {r.seed} over "
                                                     f"{timeout_s:g} s")
                    culprit = r.index
                    raise RolloutAborted("timeout")
            if chunk < width and answered / len(runs) * 2 * chunk <= timeout_s / 10:
                chunk = min(2 * chunk, width)
    except RolloutAborted as exc:
        partial = {i: (0, 0.0) for i in range(len(seeds)) if done[i] is None}
        partial.update({i: (r.steps, r.total) for i, r in running.items()})
        raise BatchAborted(exc, done, partial, culprit if exc.status == "timeout" else None) from None
    finally:
        for env in [*envs_made, *(r.env for r in running.values())]:
            _retire(env)
    return [ep for ep in done if ep is not None]


def _retire(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001, S110 - closing is best effort: the episode's result is already known
        pass
