"""Process-pool executor with per-episode wall-clock timeouts and crash isolation."""

from __future__ import annotations

import hashlib
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
        self.job: int | None = None
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

    def __init__(self, workers: int = 0, episode_timeout_s: float = 60.0) -> None:
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

        Args:
            render_paths: Optional per-job output file (GIF/MP4); when set the episode is rendered
                to it (used by ``ratchet replay --video``).
        """
        results: list[Episode | None] = [None] * len(jobs)
        if not jobs:
            return []
        task_dict = task.to_dict()
        pending: deque[int] = deque(range(len(jobs)))
        failed_candidates: dict[str, str] = {}
        self._ensure_workers(min(self.n_workers, len(jobs)))
        idle = list(self._workers)
        busy: dict[Any, _Worker] = {}

        def finish(i: int, ep: Episode) -> None:
            results[i] = ep
            if on_episode is not None:
                on_episode(i, ep)

        while pending or busy:
            while pending and idle:
                i = pending.popleft()
                job = jobs[i]
                cid = job.candidate.id
                if cid in failed_candidates:
                    finish(i, Episode.failed(job.seed, f"skipped: {failed_candidates[cid]}", task=task))
                    continue
                w = idle.pop()
                key = _source_key(job.candidate.source)
                src = None if key in w.known_sources else job.candidate.source
                try:
                    w.conn.send(("job", i, task_dict, key, src, dict(job.candidate.params), job.seed,
                                 render_paths[i] if render_paths else None))
                except (BrokenPipeError, OSError):
                    self._replace(w, idle)
                    pending.appendleft(i)
                    continue
                w.known_sources.add(key)
                w.job = i
                w.deadline = time.monotonic() + self.episode_timeout_s
                busy[w.conn] = w
            if not busy:
                continue
            timeout = max(0.0, min(w.deadline for w in busy.values()) - time.monotonic())
            ready = wait(list(busy), timeout=timeout)
            for conn in ready:
                w = busy.pop(conn)
                try:
                    job_id, ep_dict = conn.recv()
                except (EOFError, OSError):
                    code = w.exit_code()
                    reason = f"worker died (exit code {code}) on seed {jobs[w.job].seed}"
                    failed_candidates[jobs[w.job].candidate.id] = reason
                    finish(w.job, Episode.failed(jobs[w.job].seed, reason, task=task))
                    self._replace(w, idle)
                    continue
                finish(job_id, Episode.from_dict(ep_dict))
                w.job = None
                idle.append(w)
            now = time.monotonic()
            for conn, w in list(busy.items()):
                if now >= w.deadline:
                    busy.pop(conn)
                    reason = f"timeout after {self.episode_timeout_s:g} s on seed {jobs[w.job].seed}"
                    failed_candidates[jobs[w.job].candidate.id] = reason
                    finish(w.job, Episode.failed(jobs[w.job].seed, reason, task=task))
                    self._replace(w, idle)
        return [r for r in results if r is not None]

    def _replace(self, w: _Worker, idle: list[_Worker]) -> None:
        w.kill()
        if w in self._workers:
            self._workers.remove(w)
        nw = _Worker()
        nw.wait_ready()
        self._workers.append(nw)
        idle.append(nw)

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
