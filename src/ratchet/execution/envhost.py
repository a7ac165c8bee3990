"""The trusted env host: the half of a trusted rollout that owns the environment.

With ``[execution] trusted_rollouts = true`` (the default) every worker is a pair of processes:

* the **policy process** (:func:`ratchet.execution.worker.policy_main`), inside the sandbox, which
  loads the policy and maps observations to actions, and
* this **env host**, outside the policy's sandbox, which makes the environment, steps it, counts env
  steps, sums rewards and enforces the per-episode timeout.

The two exchange only observations and actions (:mod:`ratchet.execution.protocol`), so policy code
cannot forge a return, a length or a success: the numbers the gate reads come from this process.
A policy that hangs is stopped here with its true step count; one that dies or sends garbage ends its
episode with the steps it took. Replies to the driver are the executor's usual JSON
``[job_id, episode_dict, status]`` with ``status`` one of ``"ok"``, ``"died"``, ``"timeout"``,
``"interfered"``, ``"stale"``, ``"solo"`` (the last five: the policy process must be replaced; ``"stale"``: the
candidate before this job's did not let go of it, so the job itself never ran and runs again on a fresh pair;
``"solo"``: a lockstep round outlasted the time left, or the policy process answered that its episodes must run one
at a time, so the episode runs again one at a time).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from gymnasium.spaces import Box

from ratchet.execution.channel import BadMessage, Channel, ChannelTimeout, pin_to_cpu
from ratchet.execution.protocol import BadReply, Opaque, decode_actions, decode_reply, encode_round
from ratchet.rollout import BatchAborted, Episode, InvalidAction, RolloutAborted

__all__ = ["OpponentProcess", "RemotePolicy", "envhost_main"]

_START_TIMEOUT_S = 120.0
_RETIRE_TIMEOUT_S = 10.0
_END_GRACE_S = 10.0


class RemotePolicy:
    """The policy, as seen from the env host (a :class:`ratchet.tasks.PolicyHandle`): ``start``, ``act`` and
    ``call`` are requests to the policy process.

    An observation that is an ``ndarray`` of the observation space's dtype and shape travels as raw
    bytes (``O`` + the array's bytes; the policy process knows dtype and shape from the episode
    message); anything else is pickled. The episode's deadline is a real-time timer (``SIGALRM``), so
    waiting for an answer is a single blocking ``read``.

    Args:
        chan: Channel to the policy process.
        key: Source key of the candidate's policy file.
        source: The source, or None when the policy process has it already.
        functions: The functions the task calls (``("act",)`` for an environment); the policy process checks
            the policy defines them before the episode starts.

    Raises (from ``start``/``act``/``call``):
        PolicyFailure: the policy raised, failed to load or lacks one of ``functions``.
        InvalidAction: ``act`` returned something that is not a number or numeric array.
        RolloutAborted: the policy process died, timed out or sent garbage.
    """

    isolated = True  # its own process: what the env raises is the env's (ratchet.tasks.PolicyHandle)

    def __init__(self, chan: Channel, key: str, source: str | None, functions: tuple[str, ...] = ("act",),
                 ctl: int | None = None, deadline: _Deadline | None = None) -> None:
        self.chan, self.key, self.source, self.functions, self.ctl = chan, key, source, tuple(functions), ctl
        self.raw: tuple[np.dtype, tuple[int, ...]] | None = None
        self.deadline = deadline
        #: An episode (or a lockstep batch) was asked to start on this handle: the policy process then serves this
        #: candidate until it is retired. A task may end its episode before it starts the policy (an evaluator's
        #: ``make_instance`` that raised): then nothing is asked to end, and nothing is there to retire.
        self.started = False

    def _ask(self, payload: bytes, expect: str) -> Any:
        clock = self.deadline if self.deadline is not None and self.deadline.apart else None
        if clock is not None:  # the policy's own clock runs while it works on the request
            clock.switch(_POLICY)
        try:
            self.chan.send(payload)
            return decode_reply(self.chan.recv(), expect)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise RolloutAborted("died") from None
        except (BadMessage, BadReply) as exc:
            raise RolloutAborted("interfered", str(exc)) from None
        finally:
            if clock is not None:
                clock.switch(_TASK)

    def task_clock(self, what: str) -> contextlib.AbstractContextManager[None]:
        """See :meth:`ratchet.tasks.PolicyHandle.task_clock`: the episode's timer keeps two clocks from here
        (:meth:`_Deadline.kept_apart`); without a timer, nothing."""
        return contextlib.nullcontext() if self.deadline is None else self.deadline.kept_apart(what)

    def start(self, params: Any, seed: int, spaces: tuple[Any, Any] = (None, None)) -> None:
        """Start an episode: the policy process loads the policy (its source travels the first time), binds
        the ``(observation_space, action_space)`` (pickled, with the message), seeds and calls ``reset``."""
        obs_space = spaces[0]
        self.raw = ((np.dtype(obs_space.dtype), tuple(obs_space.shape)) if isinstance(obs_space, Box) else None)
        raw = None if self.raw is None else (self.raw[0].str, self.raw[1])
        self.started = True
        self._ask(_pickled(("episode", self.key, self.source, dict(params), int(seed), raw, tuple(spaces),
                            self.functions)), "started")

    def act(self, observation: Any, params: Any) -> Any:
        """The policy's action for ``observation`` (``params`` are the policy process's own copy)."""
        raw = self.raw
        if raw is not None and type(observation) is np.ndarray and observation.dtype == raw[0] \
                and observation.shape == raw[1]:
            payload = b"O" + observation.tobytes()
        else:
            payload = _pickled(("obs", observation))
        action = self._ask(payload, "action")
        if isinstance(action, Opaque):
            raise InvalidAction(f"expected a number or a numeric array, got {action.type_name} {action.text}")
        return action

    def start_batch(self, params: Any, spaces: tuple[Any, Any]) -> int:
        """Start a lockstep batch of this candidate's episodes (:func:`ratchet.rollout.run_lockstep`): the policy
        process loads the policy and answers the most episodes it serves at once."""
        obs_space = spaces[0]
        self.raw = ((np.dtype(obs_space.dtype), tuple(obs_space.shape)) if isinstance(obs_space, Box) else None)
        raw = None if self.raw is None else (self.raw[0].str, self.raw[1])
        self.started = True
        width: int = self._ask(_pickled(("batch", self.key, self.source, dict(params), raw, tuple(spaces),
                                         self.functions)), "width")
        return width

    def act_round(self, new: list[tuple[int, int]], done: list[int], slots: list[int], observations: list[Any],
                  timeout_s: float) -> list[Any]:
        """One lockstep round: the ``done`` slots' episodes ended, start the ``new`` (slot, seed) episodes, then an
        answer per observation (an action, :class:`~ratchet.execution.protocol.Opaque` or
        :class:`~ratchet.rollout.PolicyFailure`) within ``timeout_s`` seconds."""
        raw = self.raw
        ok = raw is not None and all(type(o) is np.ndarray and o.dtype == raw[0] and o.shape == raw[1]
                                     for o in observations)
        if self.deadline is not None:
            self.deadline.arm(timeout_s)
        try:
            self.chan.send(encode_round(new, done, slots, observations, ok))
            return decode_actions(self.chan.recv(), len(slots))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise RolloutAborted("died") from None
        except (BadMessage, BadReply) as exc:
            raise RolloutAborted("interfered", str(exc)) from None
        finally:
            if self.deadline is not None:
                self.deadline.disarm()

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        """The policy's ``name(*args, params)``: a number, numeric array, tuple/list/dict of them, or
        :class:`~ratchet.execution.protocol.Opaque` for anything else (decoded strictly, never unpickled)."""
        return self._ask(_pickled(("call", name, tuple(args))), "value")

    def end(self) -> int:
        """Tell the policy process the episode is over; returns the stray processes it killed (0, asking nothing,
        when no episode was started on this handle: the policy did not run)."""
        return self._ask(_pickled(("end",)), "end") if self.started else 0

    def retire(self) -> None:
        """End the policy process's current candidate (its forked process exits; see
        :func:`ratchet.execution.worker.policy_main`), and make sure it did: only the zygote can write ``X`` on
        ``ctl``, after the candidate's process and everything it started are gone; then whatever the candidate
        left in the channel is discarded, so nothing it wrote can pass for the next candidate's answers.

        Raises:
            RolloutAborted: ``"stale"``: no confirmation within 10 s (the retired candidate kept its process alive):
                the pair must be replaced, and the next candidate's episode runs on a fresh one.
        """
        self._ask(_pickled(("retire",)), "retired")
        if self.ctl is None:
            return
        import select

        ready, _, _ = select.select([self.ctl], [], [], _RETIRE_TIMEOUT_S)
        if not ready or os.read(self.ctl, 1) != b"X":
            raise RolloutAborted("stale", "a retired candidate whose process did not exit")
        self.chan.drain()


class OpponentProcess:
    """A game's opponents as the env host reaches them (:class:`ratchet.tasks.game.OpponentHandles`): a second
    sandboxed policy process (a zygote of its own, :func:`ratchet.execution.worker.policy_main`) that serves one
    opponent at a time; switching opponents retires the one loaded, as switching candidates does. The candidate's
    process and this one share nothing but the referee, so a candidate cannot reach into its opponent.

    Each player of a game keeps a clock of its own (:mod:`ratchet.tasks.game`, "Clocks"): the game runs each turn in
    :meth:`limit`, which arms the one timer the env host has with what is left on that player's clock.

    Args:
        chan: Channel to the opponent process.
        ctl: Its zygote's retirement line (see :meth:`RemotePolicy.retire`).
        deadline: The env host's timer (shared with the candidate: one turn at a time is timed).

    Attributes:
        clock_s: Each player's clock in one game, seconds (the job's ``episode_timeout_s``; set per job).
    """

    def __init__(self, chan: Channel, ctl: int | None, deadline: _Deadline) -> None:
        self.chan, self.ctl, self.deadline = chan, ctl, deadline
        self.sent: set[str] = set()
        self.current: RemotePolicy | None = None
        self.clock_s: float | None = None

    @contextlib.contextmanager
    def limit(self, seconds: float) -> Iterator[None]:
        """A player's turn: :class:`RolloutAborted` (``"timeout"``) is raised inside it past ``seconds``; no timer
        runs after it (the referee's own work is on no player's clock)."""
        self.deadline.arm(seconds)
        try:
            yield
        finally:
            self.deadline.disarm()

    def get(self, key: str, source: str) -> RemotePolicy:
        """The handle of the opponent whose source has SHA-256 ``key`` (its source travels the first time).

        Raises:
            RolloutAborted: retiring the previous opponent failed (``"stale"``) or its process is gone.
        """
        if self.current is not None and self.current.key == key:
            return self.current
        if self.current is not None:
            self.current.retire()
        self.current = RemotePolicy(self.chan, key, None if key in self.sent else source, ("act",), self.ctl,
                                    self.deadline)
        self.sent.add(key)
        return self.current


def _pickled(message: tuple) -> bytes:
    return b"P" + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


_POLICY, _TASK = "policy", "task"


def _run_delay() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat), or 0.0 where unknown."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0

#: The env host's phase file (in its own folder, which policy code cannot write under bubblewrap): byte 0 is ``T``
#: while the task's own code runs on a clock of its own (:meth:`_Deadline.kept_apart`), ``P`` while the policy is
#: asked, ``-`` otherwise; then what the task's code is, in a line (``evaluator ... on instance 17``). The driver
#: reads it when this process dies (:meth:`ratchet.execution.process._Worker.task_death`).
PHASE_FILE = "phase"
_PHASE_BYTES = 512


class _Phase:
    """The phase file, mapped: writing a phase is a store to memory, no system call; the page outlives the process."""

    def __init__(self, path: str) -> None:
        import mmap

        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, _PHASE_BYTES)
            self.map = mmap.mmap(fd, _PHASE_BYTES)
        finally:
            os.close(fd)
        self.map[0:1] = b"-"

    def set(self, phase: bytes, what: str | None = None) -> None:
        if what is not None:
            line = what.encode("utf-8", "replace")[:_PHASE_BYTES - 2]
            self.map[1:] = line + b"\0" * (_PHASE_BYTES - 1 - len(line))
        self.map[0:1] = phase


class _Deadline:
    """A per-episode real-time timer: past it, :class:`RolloutAborted` ("timeout") is raised wherever the
    env host is (waiting for an action, or stepping the env).

    One clock for the whole episode, unless the task keeps its own code's time apart from the policy's
    (:meth:`kept_apart`, as an evaluator does): then time is charged to whoever uses it, like a chess clock. The
    policy's clock runs while it is asked (:meth:`RemotePolicy._ask`: its start, module load and ``reset``
    included), the task's clock the rest of the time; each has the episode's limit. The policy's running out is
    its failure; the task's running out is the task's fault (the exception's ``fault`` says so). Time the task's
    code spent waiting for a CPU (busy machine, or threads a policy left running on the CPU the pair shares) is
    given back to its clock, so a policy cannot run the task's clock out for it; the driver's backstop (twice the
    limit) still bounds the episode, and is the policy's failure.
    """

    def __init__(self, phase: _Phase | None = None) -> None:
        self.armed = False
        self.limit = 0.0  # seconds: what arm() was given
        self.apart = False  # two clocks (kept_apart)
        self.left = {_POLICY: 0.0, _TASK: 0.0}  # seconds left on each clock, as of `since`
        self.running = _TASK
        self.since = 0.0
        self.expired: RolloutAborted | None = None  # raised once; raised again if the code it interrupted caught it
        self.delay_at_split = 0.0  # _run_delay() when the clocks split
        self.credited = 0.0  # seconds of waiting for a CPU added back to the task's clock since
        self.phase = phase
        signal.signal(signal.SIGALRM, self._fire)

    def _fire(self, signum: int, frame: Any) -> None:
        if not self.armed:
            return
        exc = RolloutAborted("timeout")
        if self.apart:
            used = self.limit - self.left[_TASK] + (time.monotonic() - self.since if self.running == _TASK else 0)
            if used >= self.limit - 1e-3:  # the task's clock ran out (not a policy's signal handled late)
                # time this process waited for a CPU (other processes, or threads a policy left spinning on the CPU
                # it shares) is not the task's own: credited, and the task's clock runs on
                waited = _run_delay() - self.delay_at_split - self.credited
                if waited > 0.01:
                    self.credited += waited
                    self.left[_TASK] += waited
                    signal.setitimer(signal.ITIMER_REAL, waited)
                    return
                exc.fault = f"the task's own code ran {used:.1f} s, the time an episode may take"
            self.expired = exc
        self.armed = False
        raise exc

    def arm(self, seconds: float) -> None:
        self.armed, self.limit, self.apart, self.expired = True, float(seconds), False, None
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))

    def disarm(self) -> None:
        self.armed, self.apart = False, False
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self.phase is not None:
            self.phase.set(b"-")

    def switch(self, to: str) -> None:
        """Stop the running clock and start ``to``'s (while :attr:`apart`).

        Raises:
            RolloutAborted: a clock ran out before and the code it interrupted caught the exception: again.
        """
        if self.expired is not None:
            raise self.expired
        if not self.apart or to == self.running:
            return
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)  # stopped first: a signal due now is the running clock's
        now = time.monotonic()
        self.left[self.running] -= now - self.since
        self.running, self.since = to, now
        if self.phase is not None:
            self.phase.set(b"T" if to == _TASK else b"P")
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, max(self.left[to], 1e-3))

    @contextlib.contextmanager
    def kept_apart(self, what: str) -> Iterator[None]:
        """Within this context the task's own code and the policy have a clock each (see the class); ``what`` names
        the task's code in a line (the phase file's, for a death). A no-op when the timer is not armed.

        Raises:
            RolloutAborted: a clock ran out (and the code it interrupted caught the exception).
        """
        if not self.armed or self.apart:
            yield
            return
        now = time.monotonic()
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]  # what the policy has left of the episode's limit
        self.left = {_POLICY: remaining, _TASK: self.limit}
        self.running, self.since, self.apart = _TASK, now, True
        self.delay_at_split, self.credited = _run_delay(), 0.0
        if self.phase is not None:
            self.phase.set(b"T", what)
        signal.setitimer(signal.ITIMER_REAL, max(self.limit, 1e-3))
        try:
            yield
            if self.expired is not None:
                raise self.expired
        finally:  # the rest of the episode (its end) is on the policy's clock, as before
            if self.armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if self.running == _POLICY:
                self.left[_POLICY] -= time.monotonic() - self.since
            self.apart = False
            if self.phase is not None:
                self.phase.set(b"-")
            if self.armed:
                signal.setitimer(signal.ITIMER_REAL, max(self.left[_POLICY], 1e-3))


def _serve(conn: Any, chan: Channel, ctl: int | None = None, rival: tuple[Channel, int] | None = None) -> None:
    from ratchet.execution.worker import _text, send_reply
    from ratchet.tasks import task_from_dict

    deadline = _Deadline(_Phase(PHASE_FILE))  # in this process's own folder (its working directory)
    opponents = None if rival is None else OpponentProcess(rival[0], rival[1], deadline)
    loaded: str | None = None  # the candidate (source key and parameters) the policy process serves, once started
    # source key -> the source, until an episode's start has carried it to the policy process (None from then on: it
    # keeps it); the driver sends each source once, and an episode may end before it starts the policy
    sources: dict[str, str | None] = {}
    task_dicts: dict[str, Any] = {}
    tasks: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()  # from the driver (trusted)
        except (EOFError, OSError):
            return
        if msg is None:
            return
        kind, job_ids, task_key, task_dict, key, source, params, seeds, render_path, timeout_s = msg[:10]
        if kind == "job":
            job_ids, seeds = [job_ids], [seeds]
        if task_dict is not None:
            task_dicts[task_key] = task_dict
        replies: list[tuple[Episode, str]] = []
        task = None
        policy: RemotePolicy | None = None
        candidate: str | None = None
        try:
            if task_key not in tasks:
                tasks[task_key] = task_from_dict(task_dicts[task_key])
            task = tasks[task_key]
            if source is not None:
                sources[key] = source
            elif key not in sources:
                raise RuntimeError("policy source missing")
            try:
                deadline.arm(float(timeout_s))
                candidate = json.dumps([key, params], sort_keys=True)
                # the source travels once per worker pair: the policy process keeps it from then on
                policy = RemotePolicy(chan, key, sources[key], tuple(task.functions), ctl, deadline)
                if loaded is not None and loaded != candidate:
                    loaded = None
                    policy.retire()
                if kind == "job":
                    extra = {"opponents": opponents} if task.opponent_sources() else {}
                    if extra and opponents is None:
                        raise RuntimeError("a game task on a worker without an opponent process")
                    if opponents is not None:
                        opponents.clock_s = float(timeout_s)  # a game: each player's clock (the timer runs per turn)
                    replies = [(task.run_episode(policy, params, seeds[0], render_path, **extra), "ok")]
                else:
                    replies = _run_batch(task, policy, params, seeds, int(msg[10]), float(timeout_s))
                if any(status != "ok" for _, status in replies):
                    raise _Lost(replies)  # the pair is replaced: nothing more to ask the policy process
                deadline.arm(_END_GRACE_S)
                strays = policy.end()
                if strays:
                    replies = [(Episode.failed(ep.seed, f"policy left {strays} process(es) running (killed)", ep.length,
                                               ep.episode_return, task=task) if ep.error is None else ep, status)
                               for ep, status in replies]
            except _Lost as lost:
                replies = lost.replies
            except RolloutAborted as exc:  # lost before the episodes began (stale) or after they ended (at "end")
                reached = [(ep.length, ep.episode_return) for ep, _ in replies] or [(exc.length, exc.episode_return)]
                reached += [(0, 0.0)] * (len(seeds) - len(reached))
                replies = [(_aborted(exc, seed, steps, total, float(timeout_s), task), exc.status)
                           for seed, (steps, total) in zip(seeds, reached)]
        except Exception as exc:  # noqa: BLE001 - environment trouble: report it as the episodes' error
            error = f"worker error: {type(exc).__name__}: {_text(exc)}"[:500]
            replies = [(Episode.failed(seed, error, task=task), "ok") for seed in seeds]
        finally:
            deadline.disarm()  # also after an error of the env itself: no timer may fire between episodes
            if policy is not None and policy.started:  # it serves this candidate, and keeps its source, from now on
                loaded, sources[key] = candidate, None
        for job_id, (ep, status) in zip(job_ids, replies):
            if not send_reply(conn, [job_id, ep.to_dict(), status]):
                return  # the driver is gone
        if any(status != "ok" for _, status in replies):
            return  # the driver replaces this pair


class _Lost(Exception):
    """A batch's policy process was lost on the way (its episodes' replies say how)."""

    def __init__(self, replies: list[tuple[Episode, str]]) -> None:
        super().__init__("lost")
        self.replies = replies


def _run_batch(task: Any, policy: RemotePolicy, params: Any, seeds: list[int], width: int,
               timeout_s: float) -> list[tuple[Episode, str]]:
    """A lockstep batch (:meth:`ratchet.tasks.gym.GymTask.run_batch`) as ``(episode, status)`` per seed: when the
    policy process is lost, the unfinished episodes end with the reason and what they had reached; when one episode
    timed out on its own (:attr:`~ratchet.rollout.BatchAborted.culprit`), only it does, and the others are
    ``"solo"``: they did nothing wrong and run again one at a time."""
    try:
        return [(ep, "ok") for ep in task.run_batch(policy, params, seeds, width, timeout_s)]
    except BatchAborted as stop:
        cause = stop.cause
        if stop.culprit is not None:
            innocent = RolloutAborted("solo", f"seed {seeds[stop.culprit]} of its batch timed out")
        out = []
        for i, seed in enumerate(seeds):
            ep = stop.episodes[i]
            if ep is not None:
                out.append((ep, "ok"))
            else:
                steps, total = stop.partial.get(i, (0, 0.0))
                why = cause if stop.culprit is None or i == stop.culprit else innocent
                out.append((_aborted(why, seed, steps, total, timeout_s, task), why.status))
        return out


def _aborted(exc: RolloutAborted, seed: int, steps: int, total: float, timeout_s: float, task: Any) -> Episode:
    """The failed episode of a policy process that was lost (died, timed out, interfered) or of a task fault; or the
    episode the task decided all the same (:attr:`RolloutAborted.episode`: a game's opponent forfeited it)."""
    if exc.episode is not None:
        return exc.episode
    if exc.fault:  # the task's own code ran out the time: its fault, not the candidate's
        return Episode(seed, 0.0, 0, False, False, None, exc.fault[:500], {"cause": "error", "fault": "task"})
    reason = {"died": "policy process died",
              "timeout": f"timeout after {timeout_s:g} s" + (f" {exc.detail}" if exc.detail else ""),
              "interfered": f"policy process sent {exc.detail}",
              "solo": f"rerun one at a time: {exc.detail}"}.get(exc.status, exc.status)
    return Episode.failed(seed, reason, steps, total, task=task)


def envhost_main(conn: Any, chan: Channel, ctl: int | None = None, rival: tuple[Channel, int] | None = None) -> None:
    """Wait for the policy process's handshake (and the opponent process's, with ``rival``: its channel and
    retirement line), tell the driver, then serve jobs until ``conn`` closes.

    Exits with status 3 (its log says why) when a policy process does not start.
    """
    from ratchet.execution.worker import _exit_with_parent

    _exit_with_parent(own_pid_namespace=False)
    pin_to_cpu()
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # headless rendering for --video
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    import gymnasium  # noqa: F401 - imported before "ready" so start-up never counts as episode time

    for who, line in (("policy", chan), ("opponent", None if rival is None else rival[0])):
        if line is None:
            continue
        try:
            decode_reply(line.recv(time.monotonic() + _START_TIMEOUT_S), "ready")
        except (EOFError, OSError, ChannelTimeout, BadMessage, BadReply) as exc:
            print(f"{who} process did not start ({type(exc).__name__})", file=sys.stderr)
            sys.exit(3)
    conn.send_bytes(b'"ready"')
    _serve(conn, chan, ctl, rival)


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    sock_fd, read_fd, write_fd, ctl_fd = map(int, os.environ.pop("RATCHET_ENVHOST_FDS").split(","))
    rival_fds = os.environ.pop("RATCHET_OPPONENT_FDS", None)
    rival = None
    if rival_fds:
        o_read, o_write, o_ctl = map(int, rival_fds.split(","))
        rival = (Channel(o_read, o_write, max_message=1 << 20), o_ctl)
    envhost_main(Connection(sock_fd), Channel(read_fd, write_fd, max_message=1 << 20), ctl_fd, rival)
