"""Process-pool executor with per-episode wall-clock timeouts and crash isolation."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from ratchet.execution import Job
from ratchet.execution.sandbox import Sandbox
from ratchet.rollout import Episode
from ratchet.task import Task

__all__ = ["ProcessExecutor"]


def _source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class _Worker:
    """One worker: a fresh ``python -m ratchet.execution.worker`` process talking over a socket pair.

    Started with ``subprocess`` (fork + exec, no ``preexec_fn``) in its own session, so it never
    re-imports the caller's ``__main__`` and can be killed with its whole process group.
    """

    def __init__(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ, RATCHET_WORKER_FD=str(child_sock.fileno()), RATCHET_PARENT_PID=str(os.getpid()))
        self.proc = subprocess.Popen([sys.executable, "-m", "ratchet.execution.worker"], env=env,
                                     pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.ready = False
        self.known_sources: set[str] = set()
        self.known_tasks: set[str] = set()
        self.jobs: deque[int] = deque()
        self.deadline = 0.0

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Block until the worker has imported its libraries (so start-up never counts as episode time)."""
        if not self.ready and self.conn.poll(timeout):
            try:
                self.ready = self.conn.recv() == "ready"
            except (EOFError, OSError):
                self.ready = False
        return self.ready

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self) -> int | None:
        try:
            return self.proc.wait(1)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


class ProcessExecutor:
    """Runs episodes in a pool of worker processes.

    The parent never imports policy code. Workers compile each candidate once and reuse their
    environments. A worker whose episode exceeds ``episode_timeout_s`` (seconds of wall clock) is
    killed and replaced; so is one that dies (segfault, ``os._exit``, out of memory). Either way
    only that episode is an error, and the remaining queued episodes *of the same candidate* are
    recorded as skipped, so one hanging candidate costs one timeout, not one per seed.

    Args:
        workers: Number of worker processes; 0 means ``os.cpu_count()``.
        episode_timeout_s: Per-episode wall-clock limit in seconds.
    """

    def __init__(self, workers: int = 0, episode_timeout_s: float = 60.0, sandbox: Sandbox | None = None) -> None:
        self.sandbox = sandbox if sandbox is not None else Sandbox()
        self.n_workers = workers if workers and workers > 0 else (os.cpu_count() or 1)
        self.episode_timeout_s = float(episode_timeout_s)
        self._workers: list[_Worker] = []

    def _ensure_workers(self, n: int) -> None:
        self._workers = [w for w in self._workers if w.alive()]
        while len(self._workers) < n:
            self._workers.append(_Worker())
        for w in self._workers:  # started together, so they boot in parallel
            w.wait_ready()

    def run(self, task: Task, jobs: Sequence[Job],
            on_episode: Callable[[int, Episode], None] | None = None,
            render_paths: Sequence[str | None] | None = None) -> list[Episode]:
        """Run ``jobs``; see :class:`~ratchet.execution.Executor`.

        Each worker holds up to two jobs (the one running and the next), so it never waits for the
        parent between episodes. A job's timeout clock starts when the job before it on the same
        worker has finished.

        Args:
            render_paths: Optional per-job output file (GIF/MP4); when set the episode is rendered
                to it (used by ``ratchet replay --video``).
        """
        results: list[Episode | None] = [None] * len(jobs)
        if not jobs:
            return []
        task_dict = task.to_dict()
        task_key = json.dumps(task_dict, sort_keys=True)
        pending: deque[int] = deque(range(len(jobs)))
        failed_candidates: dict[str, str] = {}
        self._ensure_workers(min(self.n_workers, len(jobs)))
        workers = list(self._workers)
        for w in workers:
            w.jobs = deque()

        def finish(i: int, ep: Episode) -> None:
            results[i] = ep
            if on_episode is not None:
                on_episode(i, ep)

        def fail_head(w: _Worker, reason: str) -> None:
            """The worker's running job failed (timeout or crash): record it, requeue the job queued
            behind it (it never started), and replace the worker."""
            head = w.jobs.popleft()
            failed_candidates[jobs[head].candidate.id] = reason
            finish(head, Episode.failed(jobs[head].seed, reason, task=task))
            pending.extendleft(reversed(w.jobs))
            workers.remove(w)
            workers.append(self._replace(w))

        def dispatch(w: _Worker) -> bool:
            while pending:
                i = pending.popleft()
                job = jobs[i]
                cid = job.candidate.id
                if cid in failed_candidates:
                    finish(i, Episode.failed(job.seed, f"skipped: {failed_candidates[cid]}", task=task))
                    continue
                key = _source_key(job.candidate.source)
                src = None if key in w.known_sources else job.candidate.source
                tdict = None if task_key in w.known_tasks else task_dict
                try:
                    w.conn.send(("job", i, task_key, tdict, key, src, dict(job.candidate.params), job.seed,
                                 render_paths[i] if render_paths else None))
                except (BrokenPipeError, OSError):
                    pending.appendleft(i)
                    return False
                w.known_sources.add(key)
                w.known_tasks.add(task_key)
                if not w.jobs:
                    w.deadline = time.monotonic() + self.episode_timeout_s
                w.jobs.append(i)
                return True
            return False

        while True:
            for depth in (1, 2):  # fill idle workers first, then queue one job behind each running one
                for w in list(workers):
                    if len(w.jobs) < depth and pending:
                        if not dispatch(w) and pending and not w.jobs:
                            workers.remove(w)
                            workers.append(self._replace(w))
            busy = {w.conn: w for w in workers if w.jobs}
            if not busy:
                if not pending:
                    break
                continue
            timeout = max(0.0, min(w.deadline for w in busy.values()) - time.monotonic())
            for conn in wait(list(busy), timeout=timeout):
                w = busy[conn]
                try:
                    job_id, ep_dict = conn.recv()
                except (EOFError, OSError):
                    code = w.exit_code()
                    fail_head(w, f"worker died (exit code {code}) on seed {jobs[w.jobs[0]].seed}")
                    continue
                w.jobs.popleft()
                w.deadline = time.monotonic() + self.episode_timeout_s
                finish(job_id, Episode.from_dict(ep_dict))
            now = time.monotonic()
            for w in list(busy.values()):
                if w.jobs and w in workers and now >= w.deadline:
                    fail_head(w, f"timeout after {self.episode_timeout_s:g} s on seed {jobs[w.jobs[0]].seed}")
        return [r for r in results if r is not None]

    def _replace(self, w: _Worker) -> _Worker:
        """Kill ``w`` and start a ready replacement."""
        w.kill()
        if w in self._workers:
            self._workers.remove(w)
        nw = _Worker()
        nw.wait_ready()
        self._workers.append(nw)
        return nw

    def close(self) -> None:
        """Stop all workers."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except Exception:
                pass
        for w in self._workers:
            try:
                w.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self._workers = []

    def __enter__(self) -> ProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
