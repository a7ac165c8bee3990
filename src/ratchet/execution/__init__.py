"""Executors run (candidate, seed) pairs somewhere and return :class:`~ratchet.rollout.Episode` records.

The interface is small so that backends (a local process pool, Ray) are swappable and share one
conformance test suite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ratchet.errors import RatchetError
from ratchet.execution.sandbox import Sandbox
from ratchet.policy import Candidate
from ratchet.rollout import LOCKSTEP_EPISODES, Episode
from ratchet.tasks import Task

__all__ = ["BUDGET_SKIP", "Executor", "ExecutorCapabilities", "Job", "ProcessExecutor", "Sandbox", "TrainingExecutor",
           "capabilities_of", "executor_from_spec", "make_executor", "policy_payload",
           "replay_timeout_s"]


#: How many times its run's ``episode_timeout_s`` replaying one of a run's episodes may take (``ratchet replay``, the
#: report's GIFs): the replaying machine may be slower or busier than the run's, and recording frames costs time.
REPLAY_MARGIN = 2.0


def replay_timeout_s(episode_timeout_s: float) -> float:
    """The wall-clock limit (seconds) of replaying one episode of a run whose ``[execution] episode_timeout_s`` is
    ``episode_timeout_s`` (seconds): :data:`REPLAY_MARGIN` times it."""
    return REPLAY_MARGIN * float(episode_timeout_s)


#: The error of an episode that never ran because an env-step cap (``max_env_steps``) left no room.
BUDGET_SKIP = "skipped: env-step budget used"


@dataclass(frozen=True)
class Job:
    """One episode to run: a candidate on a seed.

    Attributes:
        candidate: The candidate to roll out.
        seed: The episode's seed.
        artifacts: The bytes of the candidate's artifacts, by SHA-256 digest (every digest in
            ``candidate.artifacts``; empty for a plain program). Executors ship them to the worker
            once per candidate, where :mod:`ratchet.policies` builds the policy from them.
    """

    candidate: Candidate
    seed: int
    artifacts: Mapping[str, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)


def policy_payload(job: Job) -> str | tuple[str, str, dict[str, bytes]]:
    """What a worker needs to build ``job``'s policy (sent once per worker and candidate): the source for
    a plain program, else ``(kind, source, {role: bytes})``.

    Raises:
        RatchetError: the job lacks the bytes of one of its candidate's artifacts.
    """
    cand = job.candidate
    if cand.kind == "program" and not cand.artifacts:
        return cand.source
    missing = [r for r, h in cand.artifacts.items() if h not in job.artifacts]
    if missing:
        raise RatchetError(f"job for candidate {cand.id} lacks the bytes of its artifact(s) {missing}")
    return cand.kind, cand.source, {role: bytes(job.artifacts[h]) for role, h in cand.artifacts.items()}


@dataclass(frozen=True)
class ExecutorCapabilities:
    """What an executor does beyond running episodes: every executor declares it (:attr:`Executor.capabilities`),
    and a run reads it once, when it starts; nothing asks an executor whether it has a method.

    Attributes:
        caps_env_steps: :meth:`Executor.run` honours ``max_env_steps`` exactly. Where it does, a run prices work by
            the episode lengths seen (``[budget] pricing = "observed"``); where it does not, every episode is priced
            at the task's time limit (worst case), so the budget still holds.
        records_traces: :meth:`Executor.run` writes an episode's trace (:mod:`ratchet.trace`) to a render path
            ending in ``.json``; the critique's traces of the worst episodes are replayed only where it does.
        trains: The executor runs refiners' training jobs (:class:`TrainingExecutor`); where it does not, a training
            job is that job's recorded failure.
    """

    caps_env_steps: bool = False
    records_traces: bool = False
    trains: bool = False


def capabilities_of(executor: Any) -> ExecutorCapabilities:
    """``executor``'s declared :class:`ExecutorCapabilities` (the one place a run reads them).

    Raises:
        RatchetError: it declares none, or something else (a custom executor written before the contract had them).
    """
    from ratchet.errors import RatchetError

    caps = getattr(executor, "capabilities", None)  # the contract's check, done once here
    if not isinstance(caps, ExecutorCapabilities):
        raise RatchetError(f"executor {type(executor).__name__} declares no capabilities: give it a class attribute "
                           "`capabilities = ExecutorCapabilities(...)` (ratchet.execution; all False is a safe start)")
    return caps


class Executor(Protocol):
    """Runs jobs; a failing policy gives errored episodes, never an exception."""

    #: What it does beyond running episodes (a class attribute will do); read once when a run starts.
    capabilities: ExecutorCapabilities

    def run(self, task: Task, jobs: Sequence[Job],
            on_episode: Callable[[int, Episode], None] | None = None, *,
            max_env_steps: int | None = None, render_paths: Sequence[str | None] | None = None) -> list[Episode]:
        """Run every job and return its episode, in job order.

        Args:
            task: The task whose environments to use.
            jobs: (candidate, seed) pairs.
            on_episode: Called as ``on_episode(job_index, episode)`` as each episode finishes
                (completion order).
            max_env_steps: Hard cap on the env steps all these jobs may take together (see
                :meth:`ratchet.execution.process.ProcessExecutor.run`); None for no cap.
            render_paths: Per job, a file to record the episode to where the env runs (``.gif``/``.mp4``
                frames, ``.json`` a trace; :mod:`ratchet.tasks.recording`), or None; executors that cannot
                record ignore it.
        """

    def close(self) -> None:
        """Stop workers. Safe to call twice."""

    def describe(self) -> dict[str, Any]:
        """Where episodes run and how policy code is confined (recorded in the run's ledger)."""


class TrainingExecutor(Executor, Protocol):
    """An executor that also runs refiners' training jobs; it declares ``capabilities.trains``, and a run calls
    :meth:`train` only on one that does."""

    def train(self, task: Task, job: Any, timeout_s: float = 3600.0) -> Any:
        """Run a training job (:class:`~ratchet.execution.training.TrainingJob`) under the executor's sandbox and
        return its :class:`~ratchet.execution.training.TrainingResult` (failures are recorded in it, not raised).
        """


def make_executor(workers: int = 0, episode_timeout_s: float = 60.0, *, backend: str = "process",
                  sandbox: Sandbox | None = None, address: str | None = None, batch_episodes: int = 0,
                  death_retries: int = 1, lockstep: int = LOCKSTEP_EPISODES) -> Executor:
    """Build an executor.

    Args:
        workers: Worker processes (``"process"``) or CPUs of a local Ray (``"ray"``); 0 means one per core.
        episode_timeout_s: Per-episode wall-clock limit, seconds.
        backend: ``"process"`` (local pool) or ``"ray"`` (needs ``pip install "policy-ratchet[ray]"``).
        sandbox: How policy code is confined; default :class:`Sandbox()` (on).
        address: Ray only: cluster address (``"auto"``, ``"ray://host:10001"``); None starts a local Ray.
        batch_episodes: Ray only: the most episodes per Ray task; 0 picks one.
        death_retries: Process backend: reruns of an episode whose worker died before its death is an error.
        lockstep: Episodes of one candidate a worker steps at once with trusted rollouts (one message per round
            to the policy process); 1 runs them one at a time.

    Raises:
        RatchetError: unknown backend, or Ray asked for but not installed.
    """
    sandbox = sandbox if sandbox is not None else Sandbox()
    if backend == "process":
        from ratchet.execution.process import ProcessExecutor

        return ProcessExecutor(workers=workers, episode_timeout_s=episode_timeout_s, sandbox=sandbox,
                               death_retries=death_retries, lockstep=lockstep)
    if backend == "ray":
        from ratchet.execution.ray_executor import RayExecutor

        return RayExecutor(address=address, workers=workers, batch_episodes=batch_episodes,
                           episode_timeout_s=episode_timeout_s, sandbox=sandbox, lockstep=lockstep)
    raise RatchetError(f"unknown execution backend {backend!r}; use \"process\" or \"ray\"")


def executor_from_spec(execution: Any) -> Executor:
    """The executor a spec's ``[execution]`` section (:class:`ratchet.spec.ExecutionSpec`) asks for."""
    return make_executor(execution.workers, execution.episode_timeout_s, backend=execution.backend,
                         sandbox=Sandbox.from_spec(execution), address=execution.address,
                         batch_episodes=execution.batch_episodes,
                         death_retries=getattr(execution, "death_retries", 1),
                         lockstep=getattr(execution, "lockstep_episodes", LOCKSTEP_EPISODES))


def __getattr__(name: str):  # lazy: keep `import ratchet.execution` light
    if name == "ProcessExecutor":
        from ratchet.execution.process import ProcessExecutor

        return ProcessExecutor
    raise AttributeError(name)
