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
``"interfered"``, ``"stale"`` (the last four: the policy process must be replaced; ``"stale"``: the candidate before
this job's did not let go of it, so the job itself never ran and runs again on a fresh pair).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import time
from typing import Any

import numpy as np
from gymnasium.spaces import Box

from ratchet.execution.channel import BadMessage, Channel, ChannelTimeout, pin_to_cpu
from ratchet.execution.protocol import BadReply, Opaque, decode_reply
from ratchet.rollout import Episode, InvalidAction, RolloutAborted

__all__ = ["RemotePolicy", "envhost_main"]

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

    def __init__(self, chan: Channel, key: str, source: str | None, functions: tuple[str, ...] = ("act",),
                 ctl: int | None = None) -> None:
        self.chan, self.key, self.source, self.functions, self.ctl = chan, key, source, tuple(functions), ctl
        self.raw: tuple[np.dtype, tuple[int, ...]] | None = None

    def _ask(self, payload: bytes, expect: str) -> Any:
        try:
            self.chan.send(payload)
            return decode_reply(self.chan.recv(), expect)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise RolloutAborted("died") from None
        except (BadMessage, BadReply) as exc:
            raise RolloutAborted("interfered", str(exc)) from None

    def start(self, params: Any, seed: int, spaces: tuple[Any, Any] = (None, None)) -> None:
        """Start an episode: the policy process loads the policy (its source travels the first time), binds
        the ``(observation_space, action_space)`` (pickled, with the message), seeds and calls ``reset``."""
        obs_space = spaces[0]
        self.raw = ((np.dtype(obs_space.dtype), tuple(obs_space.shape)) if isinstance(obs_space, Box) else None)
        raw = None if self.raw is None else (self.raw[0].str, self.raw[1])
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

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        """The policy's ``name(*args, params)``: a number, numeric array, tuple/list/dict of them, or
        :class:`~ratchet.execution.protocol.Opaque` for anything else (decoded strictly, never unpickled)."""
        return self._ask(_pickled(("call", name, tuple(args))), "value")

    def end(self) -> int:
        """Tell the policy process the episode is over; returns the stray processes it killed."""
        return self._ask(_pickled(("end",)), "end")

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


def _pickled(message: tuple) -> bytes:
    return b"P" + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class _Deadline:
    """A per-episode real-time timer: past it, :class:`RolloutAborted` ("timeout") is raised wherever the
    env host is (waiting for an action, or stepping the env)."""

    def __init__(self) -> None:
        self.armed = False
        signal.signal(signal.SIGALRM, self._fire)

    def _fire(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise RolloutAborted("timeout")

    def arm(self, seconds: float) -> None:
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _serve(conn: Any, chan: Channel, ctl: int | None = None) -> None:
    from ratchet.execution.worker import _text, send_reply
    from ratchet.tasks import task_from_dict

    deadline = _Deadline()
    loaded: str | None = None  # the candidate (source key and parameters) the policy process serves

    known_sources: set[str] = set()
    task_dicts: dict[str, Any] = {}
    tasks: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()  # from the driver (trusted)
        except (EOFError, OSError):
            return
        if msg is None:
            return
        _, job_id, task_key, task_dict, key, source, params, seed, render_path, timeout_s = msg
        if task_dict is not None:
            task_dicts[task_key] = task_dict
        status, task = "ok", None
        try:
            if task_key not in tasks:
                tasks[task_key] = task_from_dict(task_dicts[task_key])
            task = tasks[task_key]
            if source is not None:
                known_sources.add(key)
            elif key not in known_sources:
                raise RuntimeError("policy source missing")
            try:
                deadline.arm(float(timeout_s))
                # the source travels once per worker pair: the policy process keeps it from then on
                policy = RemotePolicy(chan, key, source, tuple(task.functions), ctl)
                candidate = json.dumps([key, params], sort_keys=True)
                if loaded is not None and loaded != candidate:
                    policy.retire()
                loaded = candidate
                ep = task.run_episode(policy, params, seed, render_path)
                deadline.arm(_END_GRACE_S)
                strays = policy.end()
                if strays and ep.error is None:
                    ep = Episode.failed(seed, f"policy left {strays} process(es) running (killed)", ep.length,
                                        ep.episode_return, task=task)
            except RolloutAborted as exc:
                status = exc.status
                reason = {"died": "policy process died", "timeout": f"timeout after {float(timeout_s):g} s",
                          "interfered": f"policy process sent {exc.detail}"}.get(status, status)
                ep = Episode.failed(seed, reason, exc.length, exc.episode_return, task=task)
                if exc.fault:  # the task's own code ran out the time: its fault, not the candidate's
                    ep = Episode(seed, 0.0, 0, False, False, None, exc.fault[:500], {"cause": "error", "fault": "task"})
            reply = [job_id, ep.to_dict(), status]
        except Exception as exc:  # noqa: BLE001 - environment trouble: report it as this episode's error
            reply = [job_id, Episode.failed(seed, f"worker error: {type(exc).__name__}: {_text(exc)}"[:500],
                                            task=task).to_dict(), status]
        finally:
            deadline.disarm()  # also after an error of the env itself: no timer may fire between episodes
        if not send_reply(conn, reply):
            return  # the driver is gone
        if status != "ok":
            return  # the driver replaces this pair


def envhost_main(conn: Any, chan: Channel, ctl: int | None = None) -> None:
    """Wait for the policy process's handshake, tell the driver, then serve jobs until ``conn`` closes.

    Exits with status 3 (its log says why) when the policy process does not start.
    """
    from ratchet.execution.worker import _exit_with_parent

    _exit_with_parent(own_pid_namespace=False)
    pin_to_cpu()
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # headless rendering for --video
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    import gymnasium  # noqa: F401 - imported before "ready" so start-up never counts as episode time

    try:
        decode_reply(chan.recv(time.monotonic() + _START_TIMEOUT_S), "ready")
    except (EOFError, OSError, ChannelTimeout, BadMessage, BadReply) as exc:
        print(f"policy process did not start ({type(exc).__name__})", file=sys.stderr)
        sys.exit(3)
    conn.send_bytes(b'"ready"')
    _serve(conn, chan, ctl)


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    sock_fd, read_fd, write_fd, ctl_fd = map(int, os.environ.pop("RATCHET_ENVHOST_FDS").split(","))
    envhost_main(Connection(sock_fd), Channel(read_fd, write_fd, max_message=1 << 20), ctl_fd)
