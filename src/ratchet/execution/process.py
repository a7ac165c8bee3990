"""Process-pool executor with per-episode wall-clock timeouts and crash isolation."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from ratchet.errors import RatchetError, SandboxError
from ratchet.execution import Job
from ratchet.execution.sandbox import Sandbox, remove_cgroup, sweep_leftovers
from ratchet.rollout import Episode
from ratchet.task import Task

__all__ = ["ProcessExecutor"]


def _source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class _Worker:
    """One worker: a fresh ``python -m ratchet.execution.worker`` process talking over a socket pair.

    Started with ``subprocess`` (fork + exec, no ``preexec_fn``) in its own session, through the
    sandbox's launcher (bubblewrap and/or a pids cgroup), in a fresh temporary directory whose
    ``worker.log`` takes its stdout and stderr. It never re-imports the caller's ``__main__`` and
    is killed with its whole process group (and cgroup).
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self.workdir = tempfile.mkdtemp(prefix=f"ratchet-worker-{os.getpid()}-")
        sandbox.prepare_workdir(self.workdir)
        self.cgroup = sandbox.make_cgroup()
        parent_sock, child_sock = socket.socketpair()
        env = sandbox.environment(self.workdir, {"RATCHET_WORKER_FD": str(child_sock.fileno()),
                                                 "RATCHET_PARENT_PID": str(os.getpid())}, self.cgroup)
        argv = sandbox.command([sys.executable, "-m", "ratchet.execution.worker"], self.workdir, self.cgroup)
        self.log_path = os.path.join(self.workdir, "worker.log")
        with open(self.log_path, "ab") as log:  # append mode: the worker may truncate it (see worker.py)
            self.proc = subprocess.Popen(argv, env=env, cwd=self.workdir, pass_fds=(child_sock.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.ready = False
        self.known_sources: set[str] = set()
        self.known_tasks: set[str] = set()
        self.jobs: deque[int] = deque()
        self.deadline = 0.0

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Block until the worker has imported its libraries (so start-up never counts as episode time).
        Returns False at once if the launcher exits first (e.g. bubblewrap refused to start)."""
        deadline = time.monotonic() + timeout
        while not self.ready and time.monotonic() < deadline:
            if self.conn.poll(0.05):
                try:
                    self.ready = _read_json(self.conn, 10.0) == "ready"
                except (EOFError, OSError, BadReply):
                    return False
            elif self.proc.poll() is not None:
                return False
        return self.ready

    def alive(self) -> bool:
        return self.proc.poll() is None

    def death(self) -> str:
        """Why the worker died: its exit status (signal name) and the last line it wrote."""
        try:
            code = self.proc.wait(1)
        except subprocess.TimeoutExpired:
            return "worker stopped answering"
        signum = -code if code < 0 else code - 128 if 128 < code <= 192 else 0  # launchers report 128 + signal
        if signum:
            try:
                what = f"killed by {signal.Signals(signum).name}"
            except ValueError:
                what = f"killed by signal {signum}"
            if signum == signal.SIGXCPU:
                what += " (CPU-time limit)"
        else:
            what = f"exit code {code}"
        tail = _last_line(self.log_path)
        return f"worker died ({what}{': ' + tail if tail else ''})"

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
        if self.cgroup is not None:
            remove_cgroup(self.cgroup)
        shutil.rmtree(self.workdir, ignore_errors=True)


_MAX_REPLY_BYTES = 16 * 2**20
_RENDER_MAX_BYTES = 256 * 2**20  # the worker's file-size limit (RLIMIT_FSIZE)
_REPLY_TIMEOUT_S = 30.0


class BadReply(Exception):
    """A worker's reply is not a well-formed episode record for the job it was running."""


def _read_json(conn: Connection, timeout_s: float) -> Any:
    """Read one message a worker wrote with ``send_bytes`` (4-byte big-endian length, then JSON).

    Worker replies are never unpickled: policy code runs in the worker and can write anything to
    this socket, and unpickling runs code. A reply that is oversized, stalls, or is not JSON raises
    :class:`BadReply`; end of file raises EOFError.
    """
    fd = conn.fileno()
    deadline = time.monotonic() + timeout_s
    (n,) = struct.unpack("!i", _read_exact(fd, 4, deadline))
    if not 0 <= n <= _MAX_REPLY_BYTES:
        raise BadReply(f"a reply of {n} bytes")
    try:
        return json.loads(_read_exact(fd, n, deadline))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReply(f"a reply that is not JSON ({str(exc)[:80]})") from None


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise BadReply("a reply that stalled")
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _episode_reply(msg: Any, job_id: int, seed: int, step_limit: int | None = None) -> Episode:
    """The episode in a worker's ``[job_id, episode_dict]`` reply, validated against the job it was running
    (:func:`ratchet.execution.replies.parse_episode_reply`)."""
    from ratchet.execution import replies

    try:
        return replies.parse_episode_reply(msg, job_id, seed, step_limit)
    except replies.BadReply as exc:
        raise BadReply(str(exc)) from None


def _check_started(w: _Worker) -> None:
    """Wait for a new worker's handshake (no policy code has run yet, so failing is ratchet's problem).

    Raises:
        SandboxError: the worker exited or hung during start-up.
    """
    if not w.wait_ready():
        reason = w.death() if not w.alive() else "no handshake within 120 s"
        w.kill()
        raise SandboxError(f"a worker process failed to start ({reason}); rerun with --debug, or set "
                           "[execution] sandbox = false to see whether the sandbox is the cause")


def _last_line(path: str, limit: int = 200) -> str:
    """The last non-empty line of a worker's log (its stderr), shortened and cleaned for a terminal.
    The policy may have replaced the log (symlink, FIFO, device): it is read without following links
    (:func:`ratchet.safefile.read_tail`), and anything but a plain file gives ``""``."""
    from ratchet.safefile import read_tail
    from ratchet.text import clean

    try:
        tail = read_tail(path, 4096, deadline_s=2.0)
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    return clean(lines[-1], limit) if lines else ""


class ProcessExecutor:
    """Runs episodes in a pool of worker processes.

    The parent never imports policy code; workers run it inside the sandbox (see
    :mod:`ratchet.execution.sandbox`), with a fresh environment per episode. A worker whose episode
    exceeds ``episode_timeout_s`` (seconds of wall clock) is killed and replaced, and the episode is an
    error. A worker that dies (segfault, ``os._exit``, out of memory, killed from outside) is replaced
    and its episode retried on a fresh worker up to ``death_retries`` times before it is an error.
    After a timeout or a final death, the remaining queued episodes *of the same candidate* are
    recorded as skipped, so one hanging candidate costs one timeout, not one per seed.

    Args:
        workers: Number of worker processes; 0 means ``os.cpu_count()``.
        episode_timeout_s: Per-episode wall-clock limit in seconds.
        sandbox: How workers are confined (:class:`~ratchet.execution.sandbox.Sandbox`); default on.
        death_retries: Times an episode whose worker died (killed from outside, crashed) is run again
            on a fresh worker before it counts as the candidate's failure. Deterministic crashes
            (a policy that segfaults) fail again and are recorded; a stray kill leaves no trace.

    Raises:
        SandboxError: the sandbox requires isolation this machine cannot give.
    """

    def __init__(self, workers: int = 0, episode_timeout_s: float = 60.0, sandbox: Sandbox | None = None,
                 death_retries: int = 1) -> None:
        self.death_retries = int(death_retries)
        self.sandbox = sandbox if sandbox is not None else Sandbox()
        self.sandbox.check()
        sweep_leftovers()
        self.n_workers = workers if workers and workers > 0 else (os.cpu_count() or 1)
        self.episode_timeout_s = float(episode_timeout_s)
        self._workers: list[_Worker] = []

    def _ensure_workers(self, n: int) -> None:
        self._workers = [w for w in self._workers if w.alive()]
        new = [_Worker(self.sandbox) for _ in range(n - len(self._workers))]  # boot in parallel
        for w in new:
            try:
                _check_started(w)
            except RatchetError:
                w = self._start_worker()
            self._workers.append(w)

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

        renders: dict[int, tuple[str, str]] = {}

        def finish(i: int, ep: Episode) -> None:
            if i in renders:
                made, wanted = renders.pop(i)
                if os.path.lexists(made):  # copied, never moved or followed: the policy could swap it for a link
                    from ratchet.safefile import UnsafeFile, copy_out

                    try:
                        copy_out(made, wanted, _RENDER_MAX_BYTES)
                    except OSError as exc:
                        why = str(exc) if isinstance(exc, UnsafeFile) else exc.strerror or str(exc)
                        ep = Episode.failed(ep.seed, f"could not write {wanted}: {why}", task=task)
            results[i] = ep
            if on_episode is not None:
                on_episode(i, ep)

        deaths: dict[int, int] = {}

        def fail_head(w: _Worker, reason: str, retry: bool = False) -> None:
            """The worker's running job failed (timeout or crash): requeue the job queued behind it (it
            never started), replace the worker, and record the failure — unless ``retry`` (the worker
            died) and the job has retries left, in which case it runs again on a fresh worker."""
            head = w.jobs.popleft()
            pending.extendleft(reversed(w.jobs))
            deaths[head] = deaths.get(head, 0) + 1
            if retry and deaths[head] <= self.death_retries and jobs[head].candidate.id not in failed_candidates:
                pending.appendleft(head)
            else:
                failed_candidates[jobs[head].candidate.id] = reason
                finish(head, Episode.failed(jobs[head].seed, reason, task=task))
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
                render = None
                if render_paths and render_paths[i]:  # the worker writes only inside its own directory
                    render = os.path.join(w.workdir, f"render-{i}{os.path.splitext(render_paths[i])[1]}")
                    renders[i] = (render, render_paths[i])
                try:
                    w.conn.send(("job", i, task_key, tdict, key, src, dict(job.candidate.params), job.seed,
                                 render))
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
                head = w.jobs[0]
                try:
                    ep = _episode_reply(_read_json(conn, _REPLY_TIMEOUT_S), head, jobs[head].seed,
                                     getattr(task, "step_limit", None))
                except (EOFError, OSError):
                    fail_head(w, f"{w.death()} on seed {jobs[head].seed}", retry=True)
                    continue
                except BadReply as exc:  # only policy code tampering with the worker's socket does this
                    fail_head(w, f"worker sent {exc} on seed {jobs[head].seed}; the policy interfered with its "
                                 "worker")
                    continue
                w.jobs.popleft()
                w.deadline = time.monotonic() + self.episode_timeout_s
                finish(head, ep)
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
        nw = self._start_worker()
        self._workers.append(nw)
        return nw

    def _start_worker(self, attempts: int = 5) -> _Worker:
        """A ready worker; a start that fails (e.g. the process was killed from outside) is retried."""
        for attempt in range(attempts):
            w = _Worker(self.sandbox)
            try:
                _check_started(w)
                return w
            except RatchetError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def describe(self) -> dict[str, Any]:
        """``{"backend": "process", "workers": n, "sandbox": "..."}``."""
        return {"backend": "process", "workers": self.n_workers, "sandbox": self.sandbox.describe()}

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
