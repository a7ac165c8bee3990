"""Process-pool executor with per-episode wall-clock timeouts and crash isolation."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
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
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Self, cast

from ratchet.errors import RatchetError, SandboxError
from ratchet.execution import BUDGET_SKIP, ExecutorCapabilities, Job, policy_payload
from ratchet.execution.replies import BadReply, decode_reply
from ratchet.execution.sandbox import Sandbox, hide_from_policies, remove_cgroup, sweep_leftovers
from ratchet.execution.schedule import JobQueue, Lengths, fit, remaining, shares
from ratchet.rollout import LOCKSTEP_EPISODES, LOST_ENV_STEPS, Episode
from ratchet.tasks import Task

__all__ = ["ProcessExecutor"]


class _Worker:
    """One worker: fresh processes talking to the driver over a socket pair.

    With ``sandbox.trusted_rollouts`` (the default) a worker is a pair: a sandboxed policy process
    (``python -m ratchet.execution.worker``, in a fresh temporary directory whose ``worker.log`` takes
    its output; under bubblewrap it sees an empty tmpfs of its own there instead, see
    :meth:`~ratchet.execution.sandbox.Sandbox.command`) and a trusted env host (``python -m ratchet.execution.envhost``, outside the policy's
    sandbox, in a private directory of its own) that steps the environment and talks to the driver;
    the two exchange observations and actions over two pipes. Without it, one sandboxed process runs
    policy and environment together. Processes are started with ``subprocess`` (fork + exec, no
    ``preexec_fn``) in their own sessions, never re-import the caller's ``__main__``, and are killed
    with their whole process groups (and cgroup).
    """

    def __init__(self, sandbox: Sandbox, cpu: int | None = None, opponents: bool = False) -> None:
        self.trusted, self.cpu, self.sandboxed = sandbox.trusted_rollouts, cpu, sandbox.enabled
        self.opponents = opponents and self.trusted  # untrusted rollouts load opponents in the one worker process
        self.workdir = tempfile.mkdtemp(prefix=f"ratchet-worker-{os.getpid()}-")
        sandbox.prepare_workdir(self.workdir)
        self.cgroup = sandbox.make_cgroup()
        self.log_path = os.path.join(self.workdir, "worker.log")
        self.rival: _PolicyProcess | None = None
        parent_sock, child_sock = socket.socketpair()
        python = [sys.executable, "-m"]
        extra = {"RATCHET_CPU": str(cpu)} if cpu is not None and self.trusted else {}  # the pair shares one CPU
        own: list[int] = []  # this side's copies of the pipes, closed once the processes have theirs
        try:
            self.host = None
            if self.trusted:
                self.hostdir: str | None = tempfile.mkdtemp(prefix=f"ratchet-worker-{os.getpid()}-host-")  # 0700
                policy = _PolicyProcess.start(sandbox, self.workdir, self.cgroup, self.log_path, extra, own)
                self.proc = policy.proc
                host_env = dict(os.environ, RATCHET_ENVHOST_FDS=",".join(map(str, (child_sock.fileno(), *policy.host_fds))),
                                RATCHET_PARENT_PID=str(os.getpid()), **extra)
                host_fds = [child_sock.fileno(), *policy.host_fds]
                if self.opponents:  # a second sandboxed zygote of its own (folder, cgroup) for the game's opponents
                    rival_dir = tempfile.mkdtemp(prefix=f"ratchet-worker-{os.getpid()}-opponent-")
                    sandbox.prepare_workdir(rival_dir)
                    self.rival = _PolicyProcess.start(sandbox, rival_dir, sandbox.make_cgroup(),
                                                      os.path.join(rival_dir, "worker.log"), extra, own)
                    host_env["RATCHET_OPPONENT_FDS"] = ",".join(map(str, self.rival.host_fds))
                    host_fds += self.rival.host_fds
                with open(os.path.join(self.hostdir, "envhost.log"), "ab") as log:
                    self.host = subprocess.Popen([*python, "ratchet.execution.envhost"], env=host_env,
                                                 cwd=self.hostdir, pass_fds=host_fds, stdin=subprocess.DEVNULL,
                                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            else:
                self.hostdir = None
                env = sandbox.environment(self.workdir, {"RATCHET_WORKER_FD": str(child_sock.fileno()),
                                                         "RATCHET_PARENT_PID": str(os.getpid())}, self.cgroup)
                argv = sandbox.command([*python, "ratchet.execution.worker"], self.workdir, self.cgroup)
                with open(self.log_path, "ab") as log:  # append mode: the worker may truncate it (see worker.py)
                    self.proc = subprocess.Popen(argv, env=env, cwd=self.workdir, pass_fds=(child_sock.fileno(),),
                                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True)
        finally:
            child_sock.close()
            for fd in own:
                os.close(fd)
        self.conn = Connection(parent_sock.detach())
        self.ready = False
        self.known_sources: set[str] = set()
        self.known_tasks: set[str] = set()
        self.jobs: deque[int] = deque()  # the jobs sent, in order: the running message's first
        self.batches: deque[int] = deque()  # how many of them each message sent holds
        self.doomed = False  # a reply said the pair must be replaced (after the running message's last reply)
        self.again: list[int] = []  # jobs of the running message to run again on a fresh pair (died, stale)
        self.deadline = 0.0
        self.since = 0.0  # when the running message could start (monotonic): sent to an idle worker, or the last ended
        self.stepped = 0  # env steps the running message's replies so far took
        self.candidate: str | None = None  # the id of the candidate whose process the pair holds (the latest sent)

    @property
    def outdir(self) -> str:
        """Where the process that renders episodes writes its files (the env host's own directory
        when rollouts are trusted: policy code cannot write there)."""
        return self.hostdir or self.workdir

    @property
    def _driver_side(self) -> subprocess.Popen:
        return self.host or self.proc

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
            elif self._driver_side.poll() is not None:
                return False
        return self.ready

    def alive(self) -> bool:
        return all(p.poll() is None for p in self._processes())

    def _processes(self) -> list[subprocess.Popen]:
        return [p for p in (self.proc, self.host, self.rival.proc if self.rival else None) if p is not None]

    def death(self) -> str:
        """Why the worker died: the exit status (signal name) of its policy process and the last line
        it wrote; or, when the policy process lives on, of the env host."""
        proc, log = self.proc, self.log_path
        try:
            code = proc.wait(1 if self.host is None or self.host.poll() is None else 0.2)
        except subprocess.TimeoutExpired:
            if self.host is None or self.host.poll() is None:
                return "worker stopped answering"
            proc, log, code = self.host, os.path.join(self.outdir, "envhost.log"), self.host.returncode
        who = "env host" if proc is self.host else "worker"
        return f"{who} died ({_exit_text(code, log)})"

    def task_death(self) -> str | None:
        """Why the env host died, when it certainly died of the task's own code: it was running the task's code on
        the task's own clock (its phase file says so: :data:`ratchet.execution.envhost.PHASE_FILE`) and it ended
        itself (an exit, or a crash signal such as SIGSEGV or SIGABRT), where policy code can neither signal it nor
        write its folder (bubblewrap). A line naming the task's code; None otherwise (a death that may be the
        policy's or came from outside, such as SIGKILL: the policy's, as before)."""
        from ratchet.execution.envhost import PHASE_FILE
        from ratchet.execution.sandbox import isolation
        from ratchet.text import clean

        if self.host is None or self.hostdir is None or not self.sandboxed or isolation() != "bwrap":
            return None
        try:
            code = self.host.wait(2)  # its socket closes a moment before the process is gone
        except subprocess.TimeoutExpired:
            return None
        if code < 0 and -code not in _CRASH_SIGNALS:
            return None
        try:
            fd = os.open(os.path.join(self.hostdir, PHASE_FILE), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError:
            return None
        if data[:1] != b"T":
            return None
        what = clean(data[1:].split(b"\0")[0].decode("utf-8", "replace"), 300) or "the task's own code"
        return f"{what}: the process running it died ({_exit_text(code, os.path.join(self.hostdir, 'envhost.log'))})"

    def kill(self) -> None:
        for proc in self._processes():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self._processes():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.conn.close()
        for cgroup in (self.cgroup, self.rival.cgroup if self.rival else None):
            if cgroup is not None:
                remove_cgroup(cgroup)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.rival is not None:
            shutil.rmtree(self.rival.workdir, ignore_errors=True)
        if self.hostdir is not None:
            shutil.rmtree(self.hostdir, ignore_errors=True)


@dataclass
class _PolicyProcess:
    """A sandboxed policy process (a zygote, :func:`ratchet.execution.worker.policy_main`) of a trusted worker, and
    the env host's ends of its pipes (read, write, retirement line)."""

    proc: subprocess.Popen
    host_fds: list[int]
    workdir: str
    cgroup: Path | None

    @classmethod
    def start(cls, sandbox: Sandbox, workdir: str, cgroup: Path | None, log_path: str, extra: dict[str, str],
              own: list[int]) -> _PolicyProcess:
        """Start one in ``workdir`` (its output to ``log_path``); every pipe end made is appended to ``own``, for the
        caller to close once the env host has its ends."""
        to_policy_r, to_policy_w = os.pipe()
        to_host_r, to_host_w = os.pipe()
        ctl_r, ctl_w = os.pipe()  # the zygote's own line to the env host (see worker.policy_main)
        own += [to_policy_r, to_policy_w, to_host_r, to_host_w, ctl_r, ctl_w]
        env = sandbox.environment(workdir, {"RATCHET_POLICY_FDS": f"{to_policy_r},{to_host_w},{ctl_w}", **extra,
                                            "RATCHET_PARENT_PID": str(os.getpid())}, cgroup)
        argv = sandbox.command([sys.executable, "-m", "ratchet.execution.worker"], workdir, cgroup, bounded=True)
        with open(log_path, "ab") as log:  # append mode: the worker may truncate it (see worker.py)
            proc = subprocess.Popen(argv, env=env, cwd=workdir, pass_fds=(to_policy_r, to_host_w, ctl_w),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        return cls(proc, [to_host_r, to_policy_w, ctl_r], workdir, cgroup)


#: Signals a process gets from its own code (a crash), not from outside as SIGKILL (the OOM killer, a user) may be.
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT,
                            signal.SIGSYS, signal.SIGTRAP})


def _exit_text(code: int, log: str) -> str:
    """How a process ended (its exit code or signal name; ``code`` as :attr:`subprocess.Popen.returncode`), and
    the last line of its ``log``."""
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
    tail = _last_line(log)
    return f"{what}{': ' + tail if tail else ''}"


_MAX_REPLY_BYTES = 16 * 2**20
_HOST_GRACE_S = 5.0
_RENDER_MAX_BYTES = 256 * 2**20  # the worker's file-size limit (RLIMIT_FSIZE)
_REPLY_TIMEOUT_S = 30.0


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
    return decode_reply(_read_exact(fd, n, deadline))


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


def _episode_reply(msg: Any, job_id: int, seed: int, step_limit: int | None = None) -> tuple[Episode, str]:
    """The episode and status in a worker's ``[job_id, episode_dict]`` or env host's ``[job_id,
    episode_dict, status]`` reply, validated against the job it was running
    (:func:`ratchet.execution.replies.parse_episode_reply`)."""
    from ratchet.execution import replies

    status = "ok"
    if isinstance(msg, list) and len(msg) == 3:
        *msg, status = msg
        if status not in _STATUSES:
            raise BadReply("a reply with an unknown status")
    return replies.parse_episode_reply(msg, job_id, seed, step_limit), status


_STATUSES = ("ok", "died", "timeout", "interfered", "stale", "solo")


def _abort_reason(status: str, ep: Episode, seed: int, w: _Worker) -> str:
    """The failure reason for an episode an env host stopped (``status`` is not ``"ok"``)."""
    if status == "died":
        return f"{w.death()} on seed {seed}"
    if status == "timeout":
        return f"{ep.error} on seed {seed}"
    return f"{ep.error} on seed {seed}; the policy interfered with its worker"


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
    recorded as skipped, so one hanging candidate costs one timeout, not one per seed. Not skipped are the
    other episodes of a lockstep batch that one episode's hang stopped: they did nothing wrong, and run again one
    at a time for results of their own, unless the candidate has failed twice by then (it hangs on more than one
    seed, and each of them would cost a timeout).

    Args:
        workers: Number of worker processes; 0 means ``os.cpu_count()``.
        episode_timeout_s: Per-episode wall-clock limit in seconds; in a game, each player's own clock (the env
            host times each turn: :mod:`ratchet.tasks.game`, "Clocks"), so a game's episode may last twice as long.
        sandbox: How workers are confined (:class:`~ratchet.execution.sandbox.Sandbox`); default on.
        death_retries: Times an episode whose worker died (killed from outside, crashed) is run again
            on a fresh worker before it counts as the candidate's failure. Deterministic crashes
            (a policy that segfaults) fail again and are recorded; a stray kill leaves no trace.
        lockstep: With trusted rollouts and a task that can (``Task.batched_rollouts``), how many episodes
            of one candidate a worker steps at once: one message to the policy process per round of
            observations instead of one per env step (:func:`ratchet.rollout.run_lockstep`). A message holds the
            jobs of one candidate queued together (at most ``4 * lockstep``, a worker's share of the work left, and
            what the env-step cap's worst case allows; see :meth:`run`), so one candidate's code never runs beside
            another's. When a round outlasts the time left (a hang, or a policy that turned slow), the batch's
            unfinished episodes run again one at a time, each with its own timeout. 1: one episode at a time, one
            round trip per env step.

    Attributes:
        failed_candidates: The candidates the latest :meth:`run` failed as a whole (a timeout, a final death, a policy
            that interfered with its worker), id → reason: their jobs not started by then were skipped. The Ray
            executor reads it on its nodes, to skip such a candidate's jobs across its tasks.

    Raises:
        SandboxError: the sandbox requires isolation this machine cannot give.
        RatchetError: ``lockstep`` is not an int from 1 to 4096.
    """

    def __init__(self, workers: int = 0, episode_timeout_s: float = 60.0, sandbox: Sandbox | None = None,
                 death_retries: int = 1, lockstep: int = LOCKSTEP_EPISODES) -> None:
        if isinstance(lockstep, bool) or not isinstance(lockstep, int) or not 1 <= lockstep <= 4096:
            raise RatchetError(f"lockstep must be an int from 1 to 4096 (episodes at once per worker), got {lockstep!r}")
        self.death_retries, self.lockstep = int(death_retries), lockstep
        self.sandbox = sandbox if sandbox is not None else Sandbox()
        self.sandbox.check()
        sweep_leftovers()
        self.n_workers = workers if workers and workers > 0 else (os.cpu_count() or 1)
        self.episode_timeout_s = float(episode_timeout_s)
        # a trusted env host stops a hanging episode itself (with its true step count); the driver's own
        # deadline is then only a backstop for an env host that hangs: twice the limit, as a task that keeps its
        # own code's time apart from the policy's gives each a clock of that limit (PolicyHandle.task_clock)
        self._deadline_s = (2 * self.episode_timeout_s + _HOST_GRACE_S if self.sandbox.trusted_rollouts
                            else self.episode_timeout_s)
        self._workers: list[_Worker] = []
        self._opponents = False  # whether workers carry an opponent process (a game task's; see run)
        self._lengths: dict[str, Lengths] = {}  # per task: the latest episode's length on each seed (dispatch only)
        self.failed_candidates: dict[str, str] = {}

    def _ensure_workers(self, n: int) -> None:
        self._workers = [w for w in self._workers if w.alive()]
        new: list[_Worker] = []
        for _ in range(n - len(self._workers)):  # boot in parallel
            new.append(_Worker(self.sandbox, self._pick_cpu(new), self._opponents))
        for w in new:
            try:
                _check_started(w)
            except RatchetError:
                w = self._start_worker()
            self._workers.append(w)

    #: :meth:`run` honours ``max_env_steps`` exactly (the loop may then price work by observed lengths) and writes an
    #: episode's trace (:mod:`ratchet.trace`) to a render path ending in ``.json``; :meth:`train` runs training jobs.
    capabilities = ExecutorCapabilities(caps_env_steps=True, records_traces=True, trains=True)

    def run(self, task: Task, jobs: Sequence[Job],
            on_episode: Callable[[int, Episode], None] | None = None,
            render_paths: Sequence[str | None] | None = None, *, max_env_steps: int | None = None) -> list[Episode]:
        """Run ``jobs``; see :class:`~ratchet.execution.Executor`.

        Scheduling (the order and size of the messages; never a result): each job is expected to take as many
        env steps as the latest clean episode this executor saw on its seed (else their mean), and the jobs go
        longest expected first (:meth:`~ratchet.execution.schedule.JobQueue.longest_first`: a job too long to share a
        message first whichever candidate it is of, then each candidate's jobs together; alike keep their order)
        unless ``max_env_steps`` may bind, where they keep the order given (which jobs the cap skips then depends on
        the order alone). A lockstep message takes a candidate's jobs queued together whole where they fit the
        worker's fair share of the expected work left (the queued jobs' and what the workers hold has left: a running
        message's jobs less its time so far at the measured seconds per env step; split evenly, less what it holds)
        and none of the candidate's jobs went out yet, else what fits about half of it; the rest stays queued for the
        first worker to free up, so messages shrink as the queue empties. Where the order may change (no cap that
        may bind), a message begins at the jobs of the candidate whose process the worker holds while any are queued (a
        further message of it starts no process), else at a candidate on fewer workers than its share of the call's
        work asks for (:meth:`~ratchet.execution.schedule.JobQueue.head_for`): a call of fewer candidates than workers
        starts each candidate's process on about its share of the workers, not on a further worker for each message
        it is cut into. A worker holds a second message behind the
        one running (so it need not wait for the parent between messages) only while its share has room for it. ``on_episode`` is called once the idle
        workers have their next message. A job's timeout clock starts when the message before it on the same
        worker has finished.

        Args:
            render_paths: Optional per-job output file (GIF/MP4); when set the episode is rendered
                to it (used by ``ratchet replay --video``); a ``.json`` file receives the episode's trace
                instead (:func:`ratchet.trace.record_trace`).
            max_env_steps: A hard cap on the env steps these jobs may take together. A job starts only
                when the steps already taken plus the task's time limit for it and for every job still
                running fit; when none can start, the rest are recorded as ``"skipped: env-step budget
                used"`` (0 env steps). Ignored when the task has no time limit.
        """
        results: list[Episode | None] = [None] * len(jobs)
        if not jobs:
            return []
        task_dict = task.to_dict()
        task_key = json.dumps(task_dict, sort_keys=True)
        if hide_from_policies(*task.private_paths()):  # workers started from now on cannot see them
            for w in list(self._workers):  # those running already could: replace them
                w.kill()
            self._workers = []
        if bool(task.opponent_sources()) != self._opponents:  # a game's opponents need a process of their own
            self._opponents = not self._opponents
            for w in list(self._workers):
                w.kill()
            self._workers = []
        failed_candidates: dict[str, str] = {}
        self.failed_candidates = failed_candidates
        failures: dict[str, int] = {}  # per candidate in failed_candidates: how many times it failed (see dispatch)
        # a game's players each keep a clock of episode_timeout_s (ratchet.tasks.game, "Clocks"): a game may use both
        deadline_s = self._deadline_s + (self.episode_timeout_s if task.opponent_sources() else 0.0)
        self._ensure_workers(min(self.n_workers, len(jobs)))
        workers = list(self._workers)
        for w in workers:
            w.jobs = deque()

        renders: dict[int, tuple[str, str]] = {}
        cap = max_env_steps if max_env_steps is not None and task.step_limit else None
        spent, held = [0], [False]  # env steps of finished jobs; whether the cap held a job back
        # jobs go longest expected first (each seed's latest episode) unless the cap may bind (JobQueue)
        pending = JobQueue(jobs, self._lengths.setdefault(task_key, Lengths()), cap, task.step_limit, len(workers))
        hold = [0.0]  # env steps the jobs the workers hold are expected to take from now (see room)
        split: set[str] = set()  # the candidates a lockstep message of this call went out with (see take)
        unreported: deque[tuple[int, Episode]] = deque()  # finished, for on_episode once idle workers have work again

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
            if ep.error is not None and died.get(i):  # a policy that dies on every attempt (on purpose or not) pays
                lost[i] = lost.get(i, 0) + died[i]  # for all of them; a retry that succeeds (a worker killed from
                # outside, by the OOM killer or a person) leaves no trace in the ledger
            if lost.get(i):  # the env host counted steps of attempts rerun since: they were taken, so they count
                ep = dataclasses.replace(ep, diagnostics={**ep.diagnostics, LOST_ENV_STEPS: lost[i]})
            results[i] = ep
            spent[0] += ep.length
            pending.finished(i, ep.length, ep.error is None)
            unreported.append((i, ep))

        def report() -> None:
            """``on_episode`` for the episodes finished since the last call, in the order they finished."""
            while unreported:
                i, ep = unreported.popleft()
                if on_episode is not None:
                    on_episode(i, ep)

        deaths: dict[int, int] = {}
        lost: dict[int, int] = {}  # env steps the env host counted in lockstep attempts of a job rerun alone
        died: dict[int, int] = {}  # env steps the env host counted in attempts whose policy process died
        stale: dict[int, int] = {}  # jobs rerun because the candidate before them did not let go of the pair
        solo: set[int] = set()  # jobs to run one at a time (a lockstep round of theirs outlasted the time left)
        lockstep = self.lockstep if self.sandbox.trusted_rollouts and task.batched_rollouts else 1

        def replace(w: _Worker) -> None:
            """Requeue the jobs of the messages ``w`` has not started, and put a fresh pair in its place."""
            pending.extendleft(reversed(w.jobs))
            workers.remove(w)
            workers.append(self._replace(w))

        def fail_head(w: _Worker, reason: str, retry: bool = False, episode: Episode | None = None,
                      fault: str | None = None) -> None:
            """The worker's running message failed as a whole (timeout, crash, garbage): its jobs fail with ``reason``
            (the first keeps the env steps and partial return of ``episode``), unless ``retry`` (the worker died) and
            a job has retries left: then it runs again on a fresh worker. With ``fault`` (the task's own code killed
            the env host: :meth:`_Worker.task_death`) they are the task's fault instead, not the candidate's. The
            worker is replaced."""
            head = [w.jobs.popleft() for _ in range(w.batches.popleft())]
            again = []
            struck = None  # the candidate this failure fails (once, however many of its jobs the message held)
            for k, j in enumerate(head):
                deaths[j] = deaths.get(j, 0) + 1
                if retry and deaths[j] <= self.death_retries and jobs[j].candidate.id not in failed_candidates:
                    again.append(j)
                    if cap is not None and task.step_limit:  # unknown steps of the lost attempt: its worst case
                        spent[0] += task.step_limit
                elif fault is not None:
                    finish(j, Episode(jobs[j].seed, 0.0, 0, False, False, None, fault[:500],
                                      {"cause": "error", "fault": "task"}))
                else:
                    failed_candidates[jobs[j].candidate.id] = reason
                    struck = jobs[j].candidate.id
                    steps = (episode.length, episode.episode_return) if episode is not None and k == 0 else (0, 0.0)
                    finish(j, Episode.failed(jobs[j].seed, reason, *steps, task=task))
            if struck is not None:
                failures[struck] = failures.get(struck, 0) + 1
            replace(w)
            pending.extendleft(reversed([*w.again, *again]))  # with the message's jobs already marked to rerun

        def answered(w: _Worker) -> None:
            """The running message's first outstanding job was answered: when that was its last, replace a doomed
            worker, else start the clock of the next message."""
            w.jobs.popleft()
            w.batches[0] -= 1
            if w.batches[0]:
                return
            w.batches.popleft()
            now = time.monotonic()
            if w.doomed:
                replace(w)
                pending.extendleft(reversed(w.again))  # the running message's jobs to rerun go first, in order
                return
            pending.lengths.timed(now - w.since, w.stepped)  # what an env step costs, for the work left (room)
            w.since, w.stepped = now, 0
            if w.batches:
                w.deadline = now + deadline_s * w.batches[0]

        def left(w: _Worker, now: float) -> float:
            """The env steps ``w``'s jobs are expected to take from ``now``: its running message's less what the time
            since it started has done at the measured seconds per env step (:func:`remaining`), and those queued
            behind it."""
            if not w.jobs:
                return 0.0
            held = sum(pending.expect[j] for j in w.jobs)
            running = sum(pending.expect[j] for j in itertools.islice(w.jobs, w.batches[0]))
            return remaining(held, running, now - w.since, pending.lengths.step_s)

        def room(w: _Worker) -> tuple[float, float]:
            """``w``'s fair share of the work left and about half of it, in env steps (:func:`shares` of what the
            queued jobs and the jobs every worker holds are expected to take from now, less what ``w`` holds)."""
            return shares(pending.work + hold[0], len(workers), left(w, time.monotonic()))

        def take(w: _Worker, k: int) -> list[int]:
            """The jobs of the next message to ``w``: the ``k``-th job queued (:meth:`JobQueue.head_for`) and, in
            lockstep, the jobs of the same candidate queued right behind it (no renders; as many as four widths and the env-step cap's worst case
            allow): all of them where none of the candidate's jobs went out yet and they fit ``w``'s fair share of
            the work (the queued jobs' and all the workers hold, counted in full: a candidate is not split for nothing,
            each part starts its process on another worker), else what fits about half of the work left
            (:func:`room`). The rest stays queued for whichever worker frees up first, so
            messages shrink as the queue empties and the end of a heavy-tailed mix of episodes is not left to one
            worker's long message while others wait (nor to a split candidate's last part, taken whole)."""
            _, half = room(w)
            # a candidate not split yet goes whole where it fits a share of the work counted in full, as if nothing
            # had run: the work left shrinks as a call ends, and splitting starts its process on another worker
            whole = shares(pending.work + sum(pending.expect[j] for x in workers for j in x.jobs), len(workers),
                           sum(pending.expect[j] for j in w.jobs))[0]
            first = pending.pop(k)
            if lockstep == 1 or first in solo or (render_paths and render_paths[first]):
                return [first]
            cid = jobs[first].candidate.id
            run = [pending.expect[first]]  # the expected env steps of the candidate's jobs queued together
            for j in itertools.islice(pending, k, k + 4 * lockstep - 1):
                if jobs[j].candidate.id != cid or j in solo or (render_paths and render_paths[j]):
                    break
                run.append(pending.expect[j])
            size = fit(run, half if cid in split else whole, half)
            split.add(cid)
            if cap is not None:
                assert task.step_limit is not None  # cap is set only with a step limit
                running = sum(len(x.jobs) for x in workers)
                size = min(size, max(1, (cap - spent[0]) // task.step_limit - running))
            batch = [first] + [pending.pop(k) for _ in range(size - 1)]
            if pending.reorder and pending and jobs[pending[0]].candidate.id == cid:
                pending.longest_first()  # the candidate's longest went: another's may be longer than what it has left
            return batch

        def dispatch(w: _Worker) -> bool:
            held[0] = False
            while pending:
                spread = collections.Counter(x.candidate for x in workers if x.candidate is not None)
                k = pending.head_for(w.candidate, spread)  # its own candidate's jobs first, else one on too few workers
                if w.jobs and pending.expect[pending[k]] > room(w)[1]:  # beyond its share: for the first worker free
                    return False
                if cap is not None:
                    assert task.step_limit is not None  # cap is set only with a step limit
                    running = sum(len(x.jobs) for x in workers)
                    if spent[0] + (running + 1) * task.step_limit > cap:
                        if running:
                            held[0] = True
                            return False
                        while pending:
                            j = pending.popleft()
                            finish(j, Episode.failed(jobs[j].seed, BUDGET_SKIP, task=task))
                        return False
                i = pending[k]
                job = jobs[i]
                cid = job.candidate.id
                # a job rerun alone after its lockstep batch was stopped runs all the same (another episode may have
                # been the one that hung) unless the candidate failed twice: it hangs on more than one seed
                if cid in failed_candidates and (i not in solo or failures.get(cid, 0) > 1):
                    pending.pop(k)
                    finish(i, Episode.failed(job.seed, f"skipped: {failed_candidates[cid]}", task=task))
                    continue
                key = job.candidate.policy_key
                try:
                    src = None if key in w.known_sources else policy_payload(job)
                except RatchetError as exc:
                    pending.pop(k)
                    finish(i, Episode.failed(job.seed, f"worker error: {exc}", task=task))
                    continue
                batch = take(w, k)
                tdict = None if task_key in w.known_tasks else task_dict
                params = dict(job.candidate.params)
                if len(batch) > 1 or lockstep > 1 and i not in solo and not (render_paths and render_paths[i]):
                    msg: tuple = ("batch", batch, task_key, tdict, key, src, params, [jobs[j].seed for j in batch],
                                  None, self.episode_timeout_s, lockstep)
                else:
                    render = None
                    wanted = render_paths[i] if render_paths else None
                    if wanted:  # the worker writes only inside its own directory
                        render = os.path.join(w.outdir, f"render-{i}{os.path.splitext(wanted)[1]}")
                        renders[i] = (render, wanted)
                    msg = ("job", i, task_key, tdict, key, src, params, job.seed, render, self.episode_timeout_s)
                try:
                    w.conn.send(msg)
                except (BrokenPipeError, OSError):
                    pending.extendleft(reversed(batch))
                    return False
                w.known_sources.add(key)
                w.known_tasks.add(task_key)
                w.candidate = cid
                if not w.jobs:
                    w.since = time.monotonic()
                    w.deadline = w.since + deadline_s * len(batch)
                w.jobs.extend(batch)
                w.batches.append(len(batch))
                hold[0] += sum(pending.expect[j] for j in batch)
                return True
            return False

        def receive(w: _Worker, conn: Connection) -> None:
            """Handle one reply of ``w`` (for its first outstanding job)."""
            head = w.jobs[0]
            try:
                ep, status = _episode_reply(_read_json(conn, _REPLY_TIMEOUT_S), head, jobs[head].seed,
                                            task.step_limit)
            except (EOFError, OSError):
                fail_head(w, f"{w.death()} on seed {jobs[head].seed}", retry=True, fault=w.task_death())
                return
            except BadReply as exc:  # only policy code tampering with the worker's socket does this
                fail_head(w, f"worker sent {exc} on seed {jobs[head].seed}; the policy interfered with its worker")
                return
            w.stepped += ep.length
            if status == "stale" and w.trusted and stale.get(head, 0) < 3:  # only an env host says so
                stale[head] = stale.get(head, 0) + 1  # the candidate before this job's kept the pair: rerun it
                w.doomed = True
                w.again.append(head)
                answered(w)
                return
            if status == "solo" and w.trusted and head not in solo:  # a round outlasted the time: rerun it alone
                solo.add(head)
                spent[0] += ep.length  # the steps it took count against the cap all the same
                lost[head] = lost.get(head, 0) + ep.length  # and in the run's budget, with the episode that finishes
                w.doomed = True
                w.again.append(head)
                answered(w)
                return
            if status != "ok" and (ep.diagnostics.get("fault") or ep.diagnostics.get("forfeit")):
                w.doomed = True  # the task's fault, or a game its opponent forfeited when its process was lost:
                finish(head, ep)  # the episode stands as the env host decided it, on a fresh pair from here
            elif status != "ok" and jobs[head].candidate.id in failed_candidates and head not in solo:
                # a batch's other episodes (a job run alone since its batch was stopped ended on its own)
                w.doomed = True
                finish(head, Episode.failed(jobs[head].seed, f"skipped: {failed_candidates[jobs[head].candidate.id]}",
                                            ep.length, ep.episode_return, task=task))
            elif status != "ok":  # the env host stopped the episode: the policy process must go
                w.doomed = True
                reason = _abort_reason(status, ep, jobs[head].seed, w)
                deaths[head] = deaths.get(head, 0) + 1
                if status == "died" and deaths[head] <= self.death_retries \
                        and jobs[head].candidate.id not in failed_candidates:
                    spent[0] += ep.length  # the lost attempt's env steps count against the cap, and in the run's
                    died[head] = died.get(head, 0) + ep.length  # budget if the episode fails in the end (finish)
                    w.again.append(head)
                    answered(w)
                    return
                failed_candidates[jobs[head].candidate.id] = reason
                failures[jobs[head].candidate.id] = failures.get(jobs[head].candidate.id, 0) + 1
                finish(head, Episode.failed(jobs[head].seed, reason, ep.length, ep.episode_return, task=task))
            else:
                finish(head, ep)
            answered(w)

        try:
            while True:
                pending.relearn()  # new lengths (every 64th of the queue): longest first again
                now = time.monotonic()
                hold[0] = sum(left(w, now) for w in workers)  # env steps the workers' jobs are expected to take from now
                for depth in (1, 2):  # fill idle workers first, then queue one message behind each running one
                    for w in list(workers):
                        if (len(w.batches) < depth and pending and not dispatch(w) and pending and not w.jobs
                                and not held[0]):
                            workers.remove(w)
                            workers.append(self._replace(w))
                report()
                busy = {w.conn: w for w in workers if w.jobs}
                if not busy:
                    if not pending:
                        break
                    continue
                timeout = max(0.0, min(w.deadline for w in busy.values()) - time.monotonic())
                for conn in cast("list[Connection]", wait(list(busy), timeout=timeout)):  # returns what it was given
                    w = busy[conn]
                    receive(w, conn)
                    while w in workers and w.jobs and conn.poll(0):  # the rest of a batch's replies, already here
                        receive(w, conn)
                now = time.monotonic()
                for w in list(busy.values()):
                    if w.jobs and w in workers and now >= w.deadline:
                        fail_head(w, f"timeout after {self.episode_timeout_s:g} s on seed {jobs[w.jobs[0]].seed}")
        finally:
            report()  # what finished is reported, also when the run stops here (an interrupt, a failed start)
        return [r for r in results if r is not None]

    def _replace(self, w: _Worker) -> _Worker:
        """Kill ``w`` and start a ready replacement."""
        w.kill()
        if w in self._workers:
            self._workers.remove(w)
        nw = self._start_worker()
        self._workers.append(nw)
        return nw

    def _pick_cpu(self, starting: Sequence[_Worker] = ()) -> int | None:
        """The CPU for a new worker pair: the one fewest live pairs of this executor use (first ties in an
        order offset by this process's pid, so executors of different processes spread out); None when
        rollouts are not split or this process may use only one CPU."""
        if not self.sandbox.trusted_rollouts or not hasattr(os, "sched_getaffinity"):
            return None
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return None
        used = [w.cpu for w in [*self._workers, *starting] if w.cpu is not None]
        order = cpus[os.getpid() % len(cpus):] + cpus[:os.getpid() % len(cpus)]
        return min(order, key=used.count)

    def _start_worker(self, attempts: int = 5) -> _Worker:
        """A ready worker; a start that fails (e.g. the process was killed from outside) is retried."""
        for attempt in range(attempts):
            w = _Worker(self.sandbox, self._pick_cpu(), self._opponents)
            try:
                _check_started(w)
                return w
            except RatchetError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def train(self, task: Task, job: Any, timeout_s: float = 3600.0) -> Any:
        """Run a training job (:class:`~ratchet.execution.training.TrainingJob`) in a fresh process under
        this executor's sandbox; see :func:`~ratchet.execution.training.run_training`.

        Returns:
            The :class:`~ratchet.execution.training.TrainingResult` (failures are recorded in it, not raised).
        """
        from ratchet.execution.training import run_training

        return run_training(self.sandbox, task, job, timeout_s)

    def describe(self) -> dict[str, Any]:
        """``{"backend": "process", "workers": n, "sandbox": "..."}``."""
        return {"backend": "process", "workers": self.n_workers, "sandbox": self.sandbox.describe()}

    def close(self) -> None:
        """Stop all workers."""
        for w in self._workers:
            with contextlib.suppress(OSError):  # a worker that died has a closed pipe; it is killed below
                w.conn.send(None)
        for w in self._workers:
            try:
                w.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self._workers = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
