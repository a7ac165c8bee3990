"""Ray executor: batches of (candidate, seed) jobs run as Ray tasks, on a local Ray or a cluster.

Each Ray task runs one batch (jobs taken from the head of one queue across the call's candidates, longest expected
first: :mod:`ratchet.execution.schedule`, as on the process pool) through a one-worker
:class:`~ratchet.execution.process.ProcessExecutor` that lives in the Ray worker process, so policy code
stays in a sandboxed subprocess on every node, a per-episode timeout still kills it, and a crashing
policy fails only its own episodes, exactly as on the process backend. The driver keeps two tasks in flight per CPU
and submits the next as each finishes, so no CPU waits for the driver and none is left holding a long batch queued
up front.

**Exactly once.** A task returns its batch's episodes only when the whole batch is done; nothing is
streamed. If a Ray worker or node dies, Ray re-runs the task (``max_retries``) and the driver sees only
the one result of the attempt that finished, so every job is reported to ``on_episode`` exactly once and
a re-run never counts twice. Episodes are deterministic in (policy source, parameters, seed, task), so a
re-run gives the same numbers bit for bit, the same as the process backend. A batch that still fails
after its retries becomes errored episodes, never a crashed run. (The loop's ledger adds the other half:
evaluations are stored under a content key, so a resumed run never records or recomputes one twice.)
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import logging
import math
import os
import platform
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Self

from ratchet.errors import RatchetError
from ratchet.execution import BUDGET_SKIP, ExecutorCapabilities, Job
from ratchet.execution.sandbox import Sandbox
from ratchet.execution.schedule import JobQueue, Lengths, fit, shares
from ratchet.rollout import LOCKSTEP_EPISODES, Episode
from ratchet.tasks import Task

__all__ = ["RayExecutor", "default_batch_episodes"]

#: Tasks per CPU the default batch size aims for: enough to balance uneven episode lengths, few enough
#: that Ray's per-task overhead stays small (see benchmarks/ray_throughput.py).
TASKS_PER_CPU = 4
#: Ray tasks in flight per CPU of the cluster: the one running and the next, waiting at its node, so a CPU that
#: finishes a task starts another without waiting for the driver; the rest of the work stays in the driver's queue
#: for whichever CPU frees up first (a call's long episodes do not hold work queued behind them on one CPU).
IN_FLIGHT_PER_CPU = 2
#: Seconds of work a task should hold at least: ratchet's Ray task path costs about 3 ms per task
#: (benchmarks/ray_throughput.py), so 0.1 s keeps Ray's overhead under 5 %.
MIN_TASK_S = 0.1

_INSTALL_HINT = 'pip install "policy-ratchet[ray]"'
_VERSIONED = ("policy-ratchet", "gymnasium", "numpy")


def default_batch_episodes(n_jobs: int, cpus: int, episode_s: float | None = None) -> int:
    """Episodes per Ray task when ``batch_episodes = 0``.

    About :data:`TASKS_PER_CPU` tasks per CPU; when the typical episode duration is known, at least
    :data:`MIN_TASK_S` seconds of work per task; never fewer tasks than CPUs.

    Args:
        n_jobs: Episodes in the call.
        cpus: CPUs of the Ray cluster.
        episode_s: Typical wall-clock seconds of one episode on a node, or None if not known yet.

    Returns:
        At least 1.
    """
    cpus = max(1, cpus)
    size = math.ceil(n_jobs / (TASKS_PER_CPU * cpus))
    if episode_s and episode_s > 0:
        size = max(size, math.ceil(MIN_TASK_S / episode_s))
    return max(1, min(size, math.ceil(n_jobs / cpus)))


# -- inside Ray workers -------------------------------------------------------------------------------

_POOL: tuple[tuple[float, Sandbox, int], Any] | None = None  # this Ray worker's ProcessExecutor, reused across tasks
_REMOTE: Any = None  # the driver's Ray remote function for _run_batch


def _run_batch(task_dict: dict[str, Any], candidates: dict[str, dict[str, Any]], jobs: list[tuple[str, int]],
               episode_timeout_s: float, sandbox: Sandbox,
               artifacts: dict[str, bytes] | None = None, lockstep: int = LOCKSTEP_EPISODES
               ) -> tuple[list[dict[str, Any]], float, dict[str, str]]:
    """Ray task body: ``jobs`` (candidate id, seed) through a one-worker sandboxed process pool.

    Args:
        candidates: :meth:`Candidate.to_dict` by id, for the candidates in ``jobs``.
        artifacts: The bytes of those candidates' artifacts, by digest.
        lockstep: Episodes at once per worker (:class:`~ratchet.execution.process.ProcessExecutor`).

    Returns:
        The episodes (:meth:`Episode.to_dict`) in job order, the batch's wall-clock seconds, and the candidates it
        failed as a whole (:attr:`ProcessExecutor.failed_candidates`: id → reason).
    """
    global _POOL
    from ratchet.execution.process import ProcessExecutor
    from ratchet.policy import Candidate
    from ratchet.tasks import task_from_dict

    key = (float(episode_timeout_s), sandbox, int(lockstep))
    if _POOL is None or _POOL[0] != key:
        if _POOL is not None:
            _POOL[1].close()
        _POOL = (key, ProcessExecutor(workers=1, episode_timeout_s=episode_timeout_s, sandbox=sandbox,
                                      lockstep=int(lockstep)))
    cands = {cid: Candidate.from_dict(d) for cid, d in candidates.items()}
    t0 = time.perf_counter()
    try:
        eps = _POOL[1].run(task_from_dict(task_dict), [Job(cands[cid], seed, artifacts or {}) for cid, seed in jobs])
    except BaseException:  # interrupted mid-batch: a late reply must never reach the next batch
        _POOL[1].close()
        _POOL = None
        raise
    return [e.to_dict() for e in eps], time.perf_counter() - t0, dict(_POOL[1].failed_candidates)


def _train_remote(sandbox: Sandbox, task_dict: dict[str, Any], wire: tuple, timeout_s: float) -> Any:
    """Ray task body of :meth:`RayExecutor.train` (candidates travel as dicts: they hold mapping proxies)."""
    from ratchet.execution.training import TrainingJob, run_training
    from ratchet.policy import Candidate
    from ratchet.tasks import task_from_dict

    trainer, parent, settings, seeds, env_steps, artifacts = wire
    job = TrainingJob(trainer, Candidate.from_dict(parent), settings, tuple(seeds), env_steps, artifacts)
    return run_training(sandbox, task_from_dict(task_dict), job, timeout_s)


def _remote_batch(ray: Any) -> Any:
    """:func:`_run_batch` as a Ray remote function (made once per process; Ray re-exports it after a restart)."""
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(_run_batch)
    return _REMOTE


def _versions() -> dict[str, str]:
    """Versions that decide episode numbers; they must match between the driver and every node."""
    out = {"python": ".".join(platform.python_version_tuple()[:2])}
    for dist in _VERSIONED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


# -- the driver ---------------------------------------------------------------------------------------

def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RatchetError('[execution] backend = "ray" needs Ray, which is not installed; '
                           f"run: {_INSTALL_HINT}") from None
    return ray


class RayExecutor:
    """Runs episodes as Ray tasks, each a batch of consecutive jobs.

    Args:
        address: Cluster to join: ``"auto"`` (the cluster this node belongs to, see ``ray start``),
            ``"ray://host:10001"`` (Ray Client) or ``"host:6379"``; None starts a local Ray with
            ``workers`` CPUs. If Ray is already initialised in this process it is used as it is.
        workers: CPUs of a local Ray; 0 means ``os.cpu_count()``. Ignored when joining a cluster.
        batch_episodes: The most episodes per Ray task (fewer where a CPU's share of the work left is smaller;
            see :meth:`run`); 0 picks :func:`default_batch_episodes` for each call.
        episode_timeout_s: Per-episode wall-clock limit in seconds (enforced on the node).
        sandbox: How policy code is confined on the nodes; default :class:`Sandbox()`.
        max_retries: Times Ray re-runs a task whose worker process or node died.
        lockstep: Episodes each node's worker steps at once (``[execution] lockstep_episodes``).

    Raises:
        RatchetError: Ray is not installed, the cluster cannot be reached, or a node lacks ratchet or
            runs other versions of ratchet, Gymnasium or NumPy than this machine.
    """

    def __init__(self, address: str | None = None, workers: int = 0, batch_episodes: int = 0,
                 episode_timeout_s: float = 60.0, sandbox: Sandbox | None = None, max_retries: int = 3,
                 lockstep: int = LOCKSTEP_EPISODES) -> None:
        if batch_episodes < 0:
            raise RatchetError(f"batch_episodes must be ≥ 0 (0 picks one), got {batch_episodes}")
        self._ray = _import_ray()
        self.address = address
        self.workers = int(workers)
        self.batch_episodes = int(batch_episodes)
        self.episode_timeout_s = float(episode_timeout_s)
        self.sandbox = sandbox if sandbox is not None else Sandbox()
        self.max_retries, self.lockstep = int(max_retries), int(lockstep)
        self._owns_ray = self._checked = False
        self._episode_s: dict[str, deque[float]] = {}  # per task: recent batches' seconds per episode
        self._lengths: dict[str, Lengths] = {}  # per task: the latest episode's length on each seed (scheduling only)
        self._connect()

    def _connect(self) -> None:
        """Start or join Ray unless this process is connected already, then check the nodes."""
        ray = self._ray
        if not ray.is_initialized():
            self._init_ray()
        if not self._checked:
            self._check_nodes()
            self._checked = True

    def _init_ray(self) -> None:
        ray = self._ray
        # ERROR: Ray's start-up notices (its auth token, ...) would break the one-line-per-generation output
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                   "logging_level": logging.ERROR}
        if self.address is None:  # "local": a new runtime, even if `ray start` runs on this machine
            options["num_cpus"] = self.workers if self.workers > 0 else (os.cpu_count() or 1)
        try:
            ray.init(address=self.address or "local", **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            why = _first_line(exc).rstrip(".")
            if str(self.address).startswith("ray://"):
                hint = "a ray:// address needs `pip install \"ray[client]\"` and the head's client server (port 10001)"
            else:
                hint = "check [execution] address (\"auto\" needs `ray start` on this machine)"
            raise RatchetError(f"cannot start or join Ray at address {self.address!r}: {why}; {hint}") from None
        self._owns_ray = True

    def _check_nodes(self, timeout_s: float = 300.0) -> None:
        """Run a probe task on every alive node: ratchet importable and the same versions as here."""
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(_versions)
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        refs = {n["NodeManagerAddress"]: probe.options(num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote() for n in nodes}
        here = _versions()
        for node, ref in refs.items():
            try:
                there = ray.get(ref, timeout=timeout_s)
            except ray.exceptions.RayError as exc:  # ratchet missing there, a timeout, ...
                raise RatchetError(f"Ray node {node} cannot run ratchet ({type(exc).__name__}: {_first_line(exc)}); "
                                   "install policy-ratchet on every node of the cluster") from None
            if there != here:
                diff = ", ".join(f"{k} {there.get(k)} there vs {v} here" for k, v in here.items() if there.get(k) != v)
                raise RatchetError(f"Ray node {node} runs other versions ({diff}); install the same versions on "
                                   "every node, or episodes would differ between nodes")

    def cpus(self) -> int:
        """CPUs the Ray cluster has now."""
        return int(self._ray.cluster_resources().get("CPU", 1))

    def batch_size(self, task_dict: dict[str, Any], n_jobs: int) -> int:
        """The most episodes per Ray task for ``n_jobs`` episodes of a task (:meth:`Task.to_dict`): ``batch_episodes``,
        or :func:`default_batch_episodes` with the median episode duration this executor saw on that task."""
        if self.batch_episodes:
            return self.batch_episodes
        seen = self._episode_s.get(json.dumps(task_dict, sort_keys=True))
        return default_batch_episodes(n_jobs, self.cpus(), statistics.median(seen) if seen else None)

    #: :meth:`run` honours ``max_env_steps`` exactly: a batch is submitted only when its jobs' worst case
    #: fits beside every job still running; :meth:`train` runs training jobs; Ray workers record no traces.
    capabilities = ExecutorCapabilities(caps_env_steps=True, trains=True)

    def run(self, task: Task, jobs: Sequence[Job],
            on_episode: Callable[[int, Episode], None] | None = None, *,
            max_env_steps: int | None = None, render_paths: Sequence[str | None] | None = None) -> list[Episode]:
        """Run ``jobs``; see :class:`~ratchet.execution.Executor` (``render_paths`` is ignored: Ray workers do not
        record episodes).

        Scheduling is the process pool's (:mod:`ratchet.execution.schedule`; never a result): the jobs wait in one
        queue across the call's candidates, longest expected first (the latest clean episode this executor saw on
        each seed) unless ``max_env_steps`` may bind; each Ray task takes the jobs at the head of the queue, at most
        :meth:`batch_size` of them and what fits a CPU's fair share of the expected work left (else about half of
        it), so tasks shrink as the queue empties. :data:`IN_FLIGHT_PER_CPU` tasks per CPU are in flight (one
        running, one waiting at its node), and each task that finishes is replaced at once (``ray.wait``), so no
        CPU waits for the driver; the rest of the queue waits for whichever CPU frees up first.

        A task's episodes are reported to ``on_episode`` (in job order) when the task has finished, once its
        replacement is submitted. A candidate that a task failed as a whole (a timeout, a policy process that died on
        every attempt, one that interfered with its worker) has its jobs still queued recorded as
        ``"skipped: <reason>"``, as on the process pool (tasks of it already running finish). With
        ``max_env_steps`` (and a task time limit) a task is submitted only when the env steps taken plus the time
        limit of each of its jobs and of every job still running fit; a task that does not fit is shortened to the
        jobs that do, and when none can start the rest are recorded as ``"skipped: env-step budget used"``.
        Episodes come back in job order, whatever order they finished in.

        Raises:
            RatchetError: a node refused to run policy code (for example the sandbox requires isolation
                the node cannot give). Policy failures and worker deaths are errored episodes instead.
        """
        if not jobs:
            return []
        self._connect()
        ray = self._ray
        task_dict = task.to_dict()
        task_key = json.dumps(task_dict, sort_keys=True)
        size = self.batch_size(task_dict, len(jobs))
        cpus = max(1, self.cpus())
        durations = self._episode_s.setdefault(task_key, deque(maxlen=64))
        task_ref = ray.put(task_dict)
        submit = _remote_batch(ray).options(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False).remote
        cap = max_env_steps if max_env_steps is not None and task.step_limit else None
        queue = JobQueue(jobs, self._lengths.setdefault(task_key, Lengths()), cap, task.step_limit, cpus)
        in_flight: dict[Any, list[int]] = {}
        results: list[Episode | None] = [None] * len(jobs)
        failed: dict[str, str] = {}  # candidate id -> why a task failed it as a whole: its queued jobs are skipped
        unreported: deque[tuple[int, Episode]] = deque()  # finished, for on_episode once the CPUs have work again
        spent = 0

        def finish(i: int, ep: Episode) -> None:
            nonlocal spent
            results[i] = ep
            spent += ep.length
            queue.finished(i, ep.length, ep.error is None)
            unreported.append((i, ep))

        def take() -> list[int]:
            """The next task's jobs: from the head of the queue, none of a candidate that failed (none at all when the
            cap holds them back or skipped them all)."""
            held = sum(queue.expect[i] for b in in_flight.values() for i in b)
            fair, half = shares(queue.work + held, cpus)
            run = list(itertools.takewhile(lambda i: jobs[i].candidate.id not in failed, itertools.islice(queue, size)))
            n = fit([queue.expect[i] for i in run], fair, half)  # the head's candidate has not failed (fill)
            if cap is not None:
                assert task.step_limit is not None  # cap is set only with a step limit
                room = (cap - spent) // task.step_limit - sum(len(b) for b in in_flight.values())
                if room < 1:
                    if not in_flight:  # nothing will free room: the rest cannot run
                        while queue:
                            i = queue.popleft()
                            finish(i, Episode.failed(jobs[i].seed, BUDGET_SKIP, task=task))
                    return []
                n = min(n, room)
            return [queue.popleft() for _ in range(n)]

        def fill() -> None:
            """Submit tasks until every CPU has :data:`IN_FLIGHT_PER_CPU` of them, or the queue is empty."""
            while queue and len(in_flight) < IN_FLIGHT_PER_CPU * cpus:
                while queue and jobs[queue[0]].candidate.id in failed:
                    i = queue.popleft()
                    finish(i, Episode.failed(jobs[i].seed, f"skipped: {failed[jobs[i].candidate.id]}", task=task))
                batch = take() if queue else []
                if not batch:
                    return
                cands = {jobs[i].candidate.id: jobs[i].candidate for i in batch}
                blobs = {h: b for i in batch for h, b in jobs[i].artifacts.items()}
                ref = submit(task_ref, {cid: c.to_dict() for cid, c in cands.items()},
                             [(jobs[i].candidate.id, jobs[i].seed) for i in batch], self.episode_timeout_s,
                             self.sandbox, blobs, self.lockstep)
                in_flight[ref] = batch

        def report() -> None:
            """``on_episode`` for the episodes finished since the last call, in the order they finished."""
            while unreported:
                i, ep = unreported.popleft()
                if on_episode is not None:
                    on_episode(i, ep)

        try:
            while True:
                queue.relearn()  # new lengths (every 64th of the queue): longest first again
                fill()
                report()
                if not in_flight:
                    break
                (ref,), _ = ray.wait(list(in_flight), num_returns=1)
                batch = in_flight.pop(ref)
                eps, lost = self._collect(ref, [jobs[i].seed for i in batch], task, durations)
                for i, ep in zip(batch, eps, strict=True):
                    finish(i, ep)
                failed.update((cid, why) for cid, why in lost.items() if cid not in failed)
        finally:
            for ref in in_flight:  # interrupted (an exception in on_episode, Ctrl-C): stop the rest
                ray.cancel(ref, force=True)
            report()
        return [r for r in results if r is not None]

    def _collect(self, ref: Any, seeds: list[int], task: Task,
                 durations: deque[float]) -> tuple[list[Episode], dict[str, str]]:
        """A finished task's episodes (its seconds per episode go to ``durations``) and the candidates it failed as a
        whole (id → reason; :attr:`ProcessExecutor.failed_candidates <ratchet.execution.process.ProcessExecutor>`), or
        errored episodes and none if the task failed for good."""
        ray = self._ray
        try:
            dicts, seconds, failed = ray.get(ref)
            eps = [Episode.from_dict(d) for d in dicts]
        except ray.exceptions.RayTaskError as exc:  # raised by our task body: not retried
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, RatchetError):  # e.g. SandboxError: the node cannot confine policy code
                raise cause from None
            reason = f"ray task failed: {type(cause).__name__}: {_first_line(cause)}"
        except ray.exceptions.RayError as exc:  # worker or node died on every attempt, out of memory, ...
            reason = f"ray task failed after {self.max_retries} retries: {type(exc).__name__}: {_first_line(exc)}"
        else:
            if [e.seed for e in eps] == seeds:
                durations.append(seconds / len(seeds))
                return eps, {str(cid): str(why) for cid, why in failed.items()}
            reason = f"ray task returned seeds {[e.seed for e in eps]}, expected {seeds}"
        return [Episode.failed(s, reason[:500], task=task) for s in seeds], {}

    def train(self, task: Task, job: Any, timeout_s: float = 3600.0) -> Any:
        """Run a training job as one Ray task (one CPU) on the cluster, under this executor's sandbox;
        see :func:`~ratchet.execution.training.run_training`."""
        ray = self._ray
        remote = ray.remote(_train_remote).options(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)
        wire = (job.trainer, job.parent.to_dict(), dict(job.settings), list(job.seeds), job.env_steps,
                dict(job.artifacts))
        return ray.get(remote.remote(self.sandbox, task.to_dict(), wire, timeout_s))

    def describe(self) -> dict[str, Any]:
        """``{"backend": "ray", "address": ..., "sandbox": "..."}`` (the sandbox as seen on the driver's machine)."""
        return {"backend": "ray", "address": self.address or "local",
                "workers": self.workers if self.workers > 0 else "one per CPU",
                "sandbox": self.sandbox.describe()}

    def close(self) -> None:
        """Shut Ray down if this executor started it. Safe to call twice; a later :meth:`run` starts it again."""
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
            self._checked = False
        self._owns_ray = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
