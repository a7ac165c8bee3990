"""Worker process main loop. This is the only place policy code is compiled and run."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

_MODULE_CACHE_SIZE = 16
_MAX_WIDTH = 4096  # as ratchet.execution.protocol (not imported here before a batch needs it)


def _exit_with_parent(own_pid_namespace: bool) -> None:
    """Die with the parent: Linux's parent-death signal, plus a watchdog thread elsewhere (and for the
    race where the parent died before the signal was armed). A hung policy cannot outlive ratchet.
    In bubblewrap's PID namespace the parent is bwrap's init, which itself dies with ratchet."""
    given = int(os.environ.pop("RATCHET_PARENT_PID", "0"))
    parent = os.getppid() if own_pid_namespace or not given else given
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(1.0)

    if not os.environ.get("RATCHET_NO_WATCH"):
        threading.Thread(target=watch, daemon=True, name="ratchet-parent-watch").start()


class _Policies:
    """Compiled policy modules of one worker, by source key (a bounded cache)."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.codes: dict[str, Any] = {}
        self.modules: dict[str, Any] = {}

    def load(self, key: str, source: Any) -> Any:
        """The policy for ``key`` (its payload is sent only the first time), or the exception that loading
        it raised. A payload is a program's source text, or ``(kind, source, {role: bytes})`` for other
        policy kinds (built by :func:`ratchet.policies.build`). A program without ``reset()`` gets a
        freshly executed module every episode, so state it keeps in module globals cannot leak between
        episodes (results never depend on which worker or in which order episodes ran); policies with
        ``reset()`` own their state and are reused."""
        from ratchet.policy import compile_policy

        if source is not None:
            self.sources[key] = source
        if key not in self.modules:
            if len(self.modules) >= _MODULE_CACHE_SIZE:
                self.modules.pop(next(iter(self.modules)))
            payload = self.sources[key]
            try:
                if not isinstance(payload, str):
                    from ratchet.policies import build

                    self.modules[key] = build(*payload)
                else:
                    if key not in self.codes:
                        self.codes[key] = compile(payload, "<policy>", "exec")
                    self.modules[key] = compile_policy(self.codes[key], "<policy>")
            except BaseException as exc:  # noqa: BLE001 - a policy that fails to load (SystemExit too) is its episodes' outcome
                self.modules[key] = exc
        module = self.modules[key]
        if not isinstance(module, BaseException) and not hasattr(module, "reset"):
            self.modules.pop(key)
        return module

    def fresh(self, key: str) -> Any:
        """A new instance of ``key``'s policy (another executed module for a program; the cached build for other
        kinds), or the exception that building it raised; the cache is left as it was."""
        from ratchet.policy import compile_policy

        payload = self.sources[key]
        if not isinstance(payload, str):
            return self.load(key, None)
        try:
            if key not in self.codes:
                self.codes[key] = compile(payload, "<policy>", "exec")
            return compile_policy(self.codes[key], "<policy>")
        except BaseException as exc:  # noqa: BLE001 - a policy that fails to load (SystemExit too) is its episodes' outcome
            return exc


class _Generators:
    """Reads the state of the process-wide random generators that policy code can draw from without naming them
    (Python's ``random``, NumPy's global ``np.random``), in about a microsecond: two readings
    differ when anything drew from either, seeded it or set its state in between (:class:`_Batch` compares them).

    NumPy's Mersenne Twister words and position are read through its bit generator's ctypes interface; Python's
    from its generator object's fields where CPython lays them out (checked once: a draw changes what is read and
    restoring the state restores it), else through ``random.getstate()`` (about 10 µs). Made once per process
    (:func:`_generators`), in the zygote before any policy code runs.
    """

    def __init__(self) -> None:
        import ctypes
        import random

        import numpy as np

        self.string_at = ctypes.string_at
        self.bitgen_now = np.random.get_bit_generator  # type: ignore[attr-defined]
        self.bitgen = self.bitgen_now()
        self.numpy = (self.bitgen.ctypes.state_address, self.bitgen.state["state"]["key"].nbytes + 4)  # key, position
        python = random.random.__self__  # type: ignore[attr-defined]  # the generator random.random() draws from
        self.python = python.getstate
        if sys.implementation.name == "cpython":
            import _random

            start, size = id(python) + object.__basicsize__, _random.Random.__basicsize__ - object.__basicsize__

            def fields() -> bytes:
                return ctypes.string_at(start, size)

            saved, before = python.getstate(), fields()
            python.random()
            changed = fields() != before
            python.setstate(saved)
            if changed and fields() == before:
                self.python = fields

    def read(self) -> tuple[Any, Any]:
        """The generators' state now: compare two readings with ``==`` (once policy code has given NumPy's global
        generator another bit generator, no two readings are equal)."""
        if self.bitgen_now() is not self.bitgen:
            return object(), None
        return self.string_at(*self.numpy), self.python()


_GENERATORS: list[_Generators] = []


def _generators() -> _Generators:
    """This process's :class:`_Generators` (made on first use)."""
    if not _GENERATORS:
        _GENERATORS.append(_Generators())
    return _GENERATORS[0]


class _Batch:
    """A forked child's side of one lockstep batch (:mod:`ratchet.execution.protocol`): the policy state of each
    of the batch's episodes (its *slots*) and the round that maps their observations to actions.

    How the policy acts decides how its episodes share a process:

    * ``act_batch(observations, params)`` (and, for a program, no ``reset``): one instance answers every round in
      one call (``mlp`` and ``sb3`` kinds; a program that defines it). It must not keep per-episode state or draw
      from the global random generators, or its episodes depend on which others ran beside them.
    * ``start_slot``/``act_slots`` (the ``residual`` kind): the policy keeps per-episode state itself.
    * otherwise each episode gets an instance of its own (a freshly executed module with a builtins namespace of its
      own, seeded and ``reset`` as :func:`ratchet.rollout.run_episode` does) and ``act`` is called per observation.
      A program whose code names the global random generators (:func:`ratchet.policy.uses_global_random`) is served
      one episode at a time (width 1) from the start; any other runs ``width`` episodes side by side.

    What the episodes of a batch share is the process. The process-wide random generators (Python's ``random``,
    NumPy's ``np.random``) hold one episode's state at a time: each episode's start seeds them with its seed, and
    whatever policy code reaches them by (a name, a name built at run time, a library) it changes their state. So
    while two or more episodes are running, every start and every round is checked (:class:`_Generators`): policy
    code that changed the generators gets the round answered :data:`~ratchet.execution.protocol.ONE_AT_A_TIME`, and
    the env host runs the batch's unfinished episodes again one at a time, where each draws from its own seeded
    state. Either way an episode's actions are the ones it would get alone (the lockstep tests check it, every
    example). Not isolated: objects policy code reaches and changes on purpose (an attribute it sets on an imported
    module, the ``builtins`` module itself, a file): a program that does so can make its episodes depend on each
    other, in a batch as one at a time in the same process; its env steps and returns are still the env host's.
    """

    def __init__(self, policies: _Policies, key: str, params: Any, spaces: tuple[Any, Any], functions: Any,
                 sandbox: dict[str, Any] | None) -> None:
        from ratchet.policy import materialize, uses_global_random

        self.policies, self.key, self.raw_params, self.spaces, self.sandbox = policies, key, params, spaces, sandbox
        module = policies.load(key, None)
        payload = policies.sources[key]
        self.error: tuple[str, str] | None = None
        self.mode, self.width = "episodes", _MAX_WIDTH
        self.instances: dict[int, Any] = {}
        self.params: dict[int, Any] = {}
        self.running: set[int] = set()  # slots whose episode has started and not ended
        self.generators = _generators()
        self.state: tuple[Any, Any] | None = None  # the generators' state last read, while nothing changed it since
        self.diverged = False  # policy code changed the generators while two or more episodes were running
        self.shared = module
        if isinstance(module, BaseException):
            self.error = ("policy failed to load", f"{type(module).__name__}: {_text(module, 400)}")
        elif missing_function(module, functions):
            self.error = (f"policy has no callable {missing_function(module, functions)}()", "")
        elif callable(getattr(module, "act_batch", None)) and not (isinstance(payload, str) and hasattr(module, "reset")):
            self.mode, self.batch_params = "shared", materialize(params)
        elif callable(getattr(module, "act_slots", None)):
            self.mode, self.batch_params = "slots", materialize(params)
            self.width = 1 if getattr(module, "sequential", False) else _MAX_WIDTH
        elif not isinstance(payload, str):
            self.width = 1  # a kind that acts per observation and keeps its own state: one episode at a time
        else:
            self.width = 1 if uses_global_random(policies.codes.get(key) or compile(payload, "<policy>", "exec")) \
                else _MAX_WIDTH
        if self.mode != "episodes" and self.error is None:
            from ratchet.policy import bind_spaces

            bind_spaces(module, *spaces)

    def start(self, slot: int, seed: int) -> Any:
        """Start the episode in ``slot`` on ``seed``: None, or its :class:`~ratchet.execution.protocol.SlotFailure`.
        Sets ``diverged`` when the policy's start changed the global random generators while another episode ran."""
        import random

        import numpy as np

        if self.sandbox is not None:
            from ratchet.execution.sandbox import rearm_cpu_limit

            rearm_cpu_limit(int(self.sandbox["cpu_limit_s"]))  # each episode gets the CPU-time limit afresh
        random.seed(seed)  # as run_episode, before the policy's reset
        np.random.seed(seed % 2**32)
        self.state = None
        seeded = self.generators.read() if self.running else None  # another episode runs: its draws are checked
        why = self._start_policy(slot, seed)
        if seeded is not None and self.generators.read() != seeded:
            self.diverged = True
        if why is None:
            self.running.add(slot)
        return why

    def _start_policy(self, slot: int, seed: int) -> Any:
        """The policy's part of :meth:`start` (the generators are seeded): load, bind and ``reset``."""
        import copy

        from ratchet.execution.protocol import SlotFailure
        from ratchet.policy import bind_spaces, materialize

        if self.mode == "shared":
            return None
        if self.mode == "slots":
            try:
                self.shared.start_slot(slot, self.batch_params, seed)
            except BaseException as exc:  # noqa: BLE001 - the policy's reset failing is the episode's outcome
                return SlotFailure(f"policy raised {type(exc).__name__}", _text(exc, 400), start=True)
            return None
        module = self.policies.fresh(self.key)
        if isinstance(module, BaseException):
            return SlotFailure("policy failed to load", f"{type(module).__name__}: {_text(module, 400)}", start=True)
        missing = missing_function(module, ("act",))
        if missing:
            return SlotFailure(f"policy has no callable {missing}()", "", start=True)
        bind_spaces(module, *copy.deepcopy(self.spaces))  # its own, as alone: a space's generator is per episode
        params = materialize(self.raw_params)
        reset = getattr(module, "reset", None)
        if reset is not None:
            try:
                reset(params, seed)
            except BaseException as exc:  # noqa: BLE001 - the policy's reset failing is the episode's outcome
                return SlotFailure(f"policy raised {type(exc).__name__}", _text(exc, 400), start=True)
        self.instances[slot], self.params[slot] = module.act, params
        return None

    def act(self, new: list[tuple[int, int]], done: list[int], slots: list[int], observations: Any) -> bytes:
        """The encoded answer to a round: drop the ``done`` slots' state, start ``new`` slots, then one action per
        observation; or :data:`~ratchet.execution.protocol.ONE_AT_A_TIME` when policy code changed the global random
        generators while two or more episodes were running (the actions would not be those of the episodes alone)."""
        from ratchet.execution.protocol import ONE_AT_A_TIME

        for slot in done:  # at most a width's worth of episodes hold state at once
            self.instances.pop(slot, None)
            self.params.pop(slot, None)
            self.running.discard(slot)
            if self.mode == "slots":
                self.shared.end_slot(slot)
        failed = {}
        for slot, seed in new:
            why = self.start(slot, seed)
            if why is not None:
                failed[slot] = why
        watch = len(self.running) > 1
        before = (self.state or self.generators.read()) if watch else None
        reply = self._actions(failed, slots, observations)
        self.state = self.generators.read() if watch else None
        if self.diverged or self.state != before:
            self.diverged = True
            return ONE_AT_A_TIME
        return reply

    def _actions(self, failed: dict[int, Any], slots: list[int], observations: Any) -> bytes:
        """The encoded actions of a round's ``slots`` (``failed``: the slots whose start failed, and why)."""
        from ratchet.execution.protocol import SlotFailure, encode_actions, encode_error

        n = len(slots)
        if self.mode == "shared" or self.mode == "slots":
            if failed and len(failed) == n:
                return encode_actions([failed[s] for s in slots], n)
            try:
                if self.mode == "shared":
                    out = self.shared.act_batch(observations, self.batch_params)
                else:
                    out = [SlotFailure(f"policy raised {type(a).__name__}", _text(a, 400)) if isinstance(a, BaseException)
                           else a for a in self.shared.act_slots(slots, observations, self.batch_params)]
            except BaseException as exc:  # noqa: BLE001 - the policy's failure is the round's episodes' outcome
                return encode_error(f"policy raised {type(exc).__name__}", _text(exc, 400))
            if failed:
                out = [failed.get(s, a) for s, a in zip(slots, list(out))]
            return encode_actions(out, n)
        results: list[Any] = []
        instances, params = self.instances, self.params
        for s, obs in zip(slots, observations):
            act = instances.get(s)
            if act is None:
                results.append(failed.get(s) or SlotFailure("policy has no episode in this slot", ""))
                continue
            try:
                results.append(act(obs, params[s]))
            except BaseException as exc:  # noqa: BLE001 - the policy's failure is the episode's outcome
                results.append(SlotFailure(f"policy raised {type(exc).__name__}", _text(exc, 400)))
        return encode_actions(results, n)


def _start(sandbox: dict[str, Any] | None) -> None:
    """Confine this process (when the parent passed sandbox settings) and silence its stdout."""
    _exit_with_parent(own_pid_namespace=sandbox is not None and sandbox.get("isolation") == "bwrap")
    if sandbox is not None:
        from ratchet.execution.sandbox import confine

        confine(sandbox)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # headless rendering for --video
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not os.environ.get("RATCHET_WORKER_OUTPUT"):
        devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker
        sys.stdout = devnull


def policy_main(chan: Any, ctl: int | None = None) -> None:
    """Serve a trusted env host (:mod:`ratchet.execution.envhost`) over ``chan``: the policy half of a
    trusted rollout. This process never sees the environment, its rewards or the step count; it maps
    the observations it is sent to actions (see :mod:`ratchet.execution.protocol`).

    It is a *zygote*: it never runs policy code itself. For each candidate it forks a child that loads
    the policy and serves that candidate's episodes until the env host retires it; so a policy that
    tampers with the interpreter (monkeypatches NumPy, plants code in the worker's modules) affects
    only its own episodes, never a later candidate's. A child that dies takes the zygote with it, with
    the child's exit status, so the driver reports the death as before.

    A child holds the channel's pipes, so a policy could keep serving after it was retired and answer for the
    next candidate. So only the zygote holds ``ctl``, a pipe to the env host each child closes before any policy
    code runs: once a retired child has exited and every process it left (re-parented here: the zygote is a child
    subreaper) is killed, the zygote writes ``X`` there, and the env host starts the next candidate only then
    (:meth:`ratchet.execution.envhost.RemotePolicy.retire`). Each child runs in a fresh folder of its own inside the
    worker's, which the zygote empties before it confirms a retirement (it exits instead where it cannot), and the
    worker's folder is not on the import path, so a candidate cannot leave modules or files for the next.
    """
    import pickle

    import gymnasium.spaces  # noqa: F401 - the episode message carries the task's spaces (pickled); import before "ready"
    import numpy as np  # noqa: F401 - imported once here, before forking, for every candidate

    # what each candidate's child uses, imported once here (a child's own imports die with it: they would cost
    # every candidate milliseconds)
    import ratchet.execution.protocol
    import ratchet.policy  # noqa: F401
    from ratchet.execution.channel import pin_to_cpu
    from ratchet.execution.sandbox import clear_folder

    _generators()  # read from here on by every candidate's lockstep batches; made before any policy code runs

    sandbox = json.loads(os.environ.pop("RATCHET_SANDBOX")) if "RATCHET_SANDBOX" in os.environ else None
    pin_to_cpu()
    _start(sandbox)
    home = os.getcwd()  # under bubblewrap an empty tmpfs of its own (Sandbox.command's bounded)
    keep = set(os.listdir(home))  # without bubblewrap, the worker's log
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(home)]  # no planted modules
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: a retired child's orphans come back here
        libc.prctl(4, 0)  # PR_SET_DUMPABLE 0: no process of this uid may open /proc/<zygote>/fd (ctl) or ptrace it
    except (OSError, AttributeError):
        pass
    policies = _Policies()
    chan.send(b"R")
    n_children = 0
    while True:
        try:
            data = chan.recv()  # from the trusted env host only
        except (EOFError, OSError):
            return
        msg = pickle.loads(data[1:])
        if msg[0] not in ("episode", "batch"):
            return
        if msg[2] is not None:
            policies.sources[msg[1]] = msg[2]
        payload = policies.sources.get(msg[1])
        if isinstance(payload, tuple) and payload[0] == "sb3":
            _preload_sb3()
        n_children += 1
        own = os.path.join(home, f"candidate-{n_children}")
        os.mkdir(own, 0o700)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if ctl is not None:
                    os.close(ctl)  # before any policy code: only the zygote can confirm a retirement
                os.chdir(own)
                os.environ.update(HOME=own, TMPDIR=own)
                _serve_candidate(chan, msg, policies, sandbox)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            from ratchet.execution.sandbox import reap_strays

            reap_strays()  # whatever the child left running, re-parented to this subreaper
            if not clear_folder(home, keep):  # what the candidate wrote anywhere it could, its `..` included
                os._exit(1)  # unconfirmed: the env host replaces the pair, the next candidate starts on a fresh one
            if ctl is not None:
                os.write(ctl, b"X")
            continue  # retired
        code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status) or 1
        sys.stderr.flush()
        os._exit(code)


def _preload_sb3() -> None:
    """Import PyTorch and Stable-Baselines3 (libraries only, nothing unpickled) once in the zygote, so each
    ``sb3`` candidate's forked child does not pay the import again (seconds each)."""
    if "stable_baselines3" in sys.modules:
        return
    try:
        from ratchet.policies.sb3 import _torch_single_thread

        _torch_single_thread()
        import stable_baselines3  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - a preload; the child reports it when it loads the policy
        pass


def _serve_candidate(chan: Any, first: tuple, policies: _Policies, sandbox: dict[str, Any] | None) -> None:
    """A forked child of :func:`policy_main`: serve one candidate's episodes, starting with ``first``,
    until the env host sends ``("retire",)``."""
    import ctypes
    import pickle
    import random
    import struct

    import numpy as np

    from ratchet.execution.protocol import decode_round, encode_action, encode_error, encode_value
    from ratchet.policy import bind_spaces, materialize

    if sandbox is not None:
        from ratchet.execution.sandbox import reap_strays, rearm_cpu_limit

        try:
            ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the policy's orphans come back here
        except (OSError, AttributeError):
            pass
    act: Any = None  # the policy's act, once an episode starts
    module: Any = None  # the policy's module, once an episode starts
    params: dict[str, Any] = {}
    raw: Any = None  # (dtype, shape) of raw observations, announced with the episode
    frombuffer = np.frombuffer
    msg: tuple | None = first
    batch: _Batch | None = None
    while True:
        if msg is None:
            try:
                data = chan.recv()
            except (EOFError, OSError):
                return
            if data[:1] == b"O":  # an observation as raw bytes, of the dtype and shape the episode announced
                msg = ("obs", frombuffer(data, raw[0], offset=1).reshape(raw[1]).copy())
            elif data[:1] == b"B":  # a lockstep round
                msg = ("round", data)
            else:
                msg = pickle.loads(data[1:])
        kind = msg[0]
        try:
            if kind == "round":
                if batch is None:
                    reply = encode_error("no batch started", "")
                else:
                    reply = batch.act(*decode_round(msg[1], raw))
            elif kind == "batch":
                _, key, source, params, raw, spaces, functions = msg
                raw = None if raw is None else (np.dtype(raw[0]), tuple(raw[1]))
                if source is not None:
                    policies.sources[key] = source
                batch = _Batch(policies, key, params, spaces, functions, sandbox)
                reply = encode_error(*batch.error) if batch.error else b"W" + struct.pack("<I", batch.width)
            elif kind == "obs":
                try:
                    reply = encode_action(act(msg[1], params))
                except BaseException as exc:  # noqa: BLE001 - the policy's failure is the episode's outcome
                    reply = encode_error(f"policy raised {type(exc).__name__}", _text(exc, 400))
            elif kind == "call":
                try:
                    reply = encode_value(getattr(module, msg[1])(*msg[2], params))
                except BaseException as exc:  # noqa: BLE001 - the policy's failure is the instance's outcome
                    reply = encode_error(f"policy raised {type(exc).__name__} in {msg[1]}()", _text(exc, 400))
            elif kind == "episode":
                _, key, source, params, seed, raw = msg[:6]
                spaces = msg[6] if len(msg) > 6 else (None, None)  # (observation, action) spaces, from the env host
                functions = msg[7] if len(msg) > 7 else ("act",)  # what the task calls
                raw = None if raw is None else (np.dtype(raw[0]), tuple(raw[1]))
                if sandbox is not None:
                    rearm_cpu_limit(int(sandbox["cpu_limit_s"]))
                module = policies.load(key, source)
                act, params = None, materialize(params)
                if not isinstance(module, BaseException):
                    bind_spaces(module, *spaces)
                if isinstance(module, BaseException):
                    reply = encode_error("policy failed to load", f"{type(module).__name__}: {_text(module, 400)}")
                elif missing_function(module, functions):
                    reply = encode_error(f"policy has no callable {missing_function(module, functions)}()", "")
                else:
                    random.seed(seed)
                    np.random.seed(seed % 2**32)
                    reply = b"K"
                    reset = getattr(module, "reset", None)
                    if reset is not None:
                        try:
                            reset(params, seed)
                        except BaseException as exc:  # noqa: BLE001 - the policy's reset failing is the episode's outcome
                            reply = encode_error(f"policy raised {type(exc).__name__}", _text(exc, 400))
                    act = getattr(module, "act", None)
            elif kind == "end":
                batch = None
                _trim_log()
                strays = reap_strays() if sandbox is not None else 0
                reply = b"S" + json.dumps({"strays": strays}).encode()
            elif kind == "retire":
                chan.send(b"X")
                return
            else:
                return
            chan.send(reply)
        except (BrokenPipeError, OSError):
            return  # the env host is gone
        msg = None


def worker_main(conn: Any) -> None:
    """Serve whole-episode jobs from ``conn`` until it closes: policy and environment in this one
    process (``[execution] trusted_rollouts = false``; the trusted default splits them, see
    :mod:`ratchet.execution.envhost`).

    Confines itself first when the parent passed sandbox settings (``RATCHET_SANDBOX``): resource
    limits, network namespace, child-subreaper (see :mod:`ratchet.execution.sandbox`). After each
    episode, processes the policy left behind are killed and the episode counts as failed.

    Messages in: ``("job", job_id, task_key, task_dict_or_None, source_key, source_or_None, params, seed,
    render_path, timeout_s)`` (the task and source travel only the first time a worker sees them).
    Messages out: ``(job_id, episode_dict)``.
    """
    sandbox = json.loads(os.environ.pop("RATCHET_SANDBOX")) if "RATCHET_SANDBOX" in os.environ else None
    _start(sandbox)
    if sandbox is not None:
        from ratchet.execution.sandbox import reap_strays, rearm_cpu_limit
    import gymnasium  # noqa: F401 - imported before "ready" so start-up never counts as episode time

    from ratchet.policy import materialize
    from ratchet.rollout import Episode
    from ratchet.tasks import task_from_dict

    conn.send_bytes(b'"ready"')  # replies are JSON, never pickles: the parent must not unpickle policy bytes
    policies = _Policies()
    task_dicts: dict[str, Any] = {}
    tasks: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        _, job_id, task_key, task_dict, key, source, params, seed, render_path, timeout = msg
        if task_dict is not None:
            task_dicts[task_key] = task_dict
        task_dict = task_dicts[task_key]
        if sandbox is not None:
            rearm_cpu_limit(int(sandbox["cpu_limit_s"]))
        try:
            if task_key not in tasks:
                tasks[task_key] = task_from_dict(task_dict)
            task = tasks[task_key]
            module = policies.load(key, source)
            missing = None if isinstance(module, BaseException) else missing_function(module, task.functions)
            if isinstance(module, BaseException):
                ep = Episode.failed(seed, f"policy failed to load: {type(module).__name__}: {module}"[:500], task=task)
            elif missing:
                ep = Episode.failed(seed, f"policy has no callable {missing}()", task=task)
            else:
                extra = {"opponents": LocalOpponents(policies, float(timeout))} if task.opponent_sources() else {}
                ep = task.run_episode(LocalPolicy(module), materialize(params), seed, render_path, **extra)
            _trim_log()
            if sandbox is not None:
                strays = reap_strays()
                if strays and ep.error is None:
                    ep = Episode.failed(seed, f"policy left {strays} process(es) running (killed)", task=task)
            reply = (job_id, ep.to_dict())
        except Exception as exc:  # noqa: BLE001 - environment trouble: report it as this episode's error
            reply = (job_id, Episode.failed(seed, f"worker error: {type(exc).__name__}: {_text(exc)}"[:500],
                                            task=_task_or_none(task_dict)).to_dict())
        if not send_reply(conn, reply):
            return  # the parent is gone


def missing_function(module: Any, functions: Any) -> str | None:
    """The first of ``functions`` (names) the loaded policy module does not define as a callable, or None."""
    return next((f for f in functions if not callable(getattr(module, f, None))), None)


class LocalPolicy:
    """A loaded policy module as a :class:`ratchet.tasks.PolicyHandle`, in the process that runs the task
    (``[execution] trusted_rollouts = false``). A ``call``'s answer goes through the same encoding as from a
    sandboxed policy process (:func:`ratchet.execution.protocol.encode_value`), so both give the same values."""

    isolated = False  # policy code shares this process: what the env raises stays the episode's error

    def __init__(self, module: Any) -> None:
        self.module = module
        self.params: Any = {}
        self.act = getattr(module, "act", None)

    def start(self, params: Any, seed: int, spaces: tuple[Any, Any] = (None, None)) -> None:
        import random

        import numpy as np

        from ratchet.policy import bind_spaces

        bind_spaces(self.module, *spaces)
        self.params = params
        random.seed(seed)
        np.random.seed(seed % 2**32)
        reset = getattr(self.module, "reset", None)
        if reset is not None:
            reset(params, seed)

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        from ratchet.execution.protocol import decode_reply, encode_value

        return decode_reply(encode_value(getattr(self.module, name)(*args, self.params)), "value")

    def task_clock(self, what: str) -> Any:
        """Nothing: in one process the driver times the whole episode (running out is the policy's failure)."""
        import contextlib

        return contextlib.nullcontext()


class LocalOpponents:
    """A game's opponents loaded in the process that runs the task (``[execution] trusted_rollouts = false``, where
    policy and referee share one sandboxed process anyway): :class:`ratchet.tasks.game.OpponentHandles`.

    Args:
        policies: Where the opponents' modules are loaded.
        clock_s: Each player's clock in one game, seconds (None: none). Nothing here can interrupt a player: the game
            reads the clocks after each turn, and the driver kills a worker that outlasts both clocks.
    """

    def __init__(self, policies: _Policies, clock_s: float | None = None) -> None:
        self.policies, self.clock_s = policies, clock_s

    def limit(self, seconds: float) -> Any:
        """A player's turn: nothing interrupts it here (see the class)."""
        import contextlib

        return contextlib.nullcontext()

    def get(self, key: str, source: str) -> LocalPolicy:
        """The loaded opponent (a fresh module per episode, as a candidate's).

        Raises:
            PolicyFailure: its file fails to load or has no ``act``.
        """
        from ratchet.rollout import PolicyFailure

        module = self.policies.load(key, source)
        if isinstance(module, BaseException):
            raise PolicyFailure("policy failed to load", f"{type(module).__name__}: {_text(module, 300)}")
        if missing_function(module, ("act",)):
            raise PolicyFailure("policy has no callable act()")
        return LocalPolicy(module)


def close_quietly(env: Any) -> None:
    """Close an environment (or None), ignoring its errors."""
    if env is not None:
        try:
            env.close()
        except Exception:  # noqa: BLE001, S110 - closing quietly is the point: the episode's result is already known
            pass


def send_reply(conn: Any, reply: Any) -> bool:
    """Send ``reply`` to the driver as JSON (never a pickle); False when the driver is gone."""
    try:
        conn.send_bytes(json.dumps(reply).encode())
        return True
    except (BrokenPipeError, ConnectionResetError, OSError):
        return False


_LOG_LIMIT = 4 * 2**20


def _trim_log() -> None:
    """Keep the worker's stderr log (opened in append mode by the parent) small: a policy that writes
    megabytes must not fill the disk or hit the file-size limit for the episodes after it."""
    try:
        if os.fstat(2).st_size > _LOG_LIMIT:
            os.ftruncate(2, 0)
    except OSError:
        pass


def _text(exc: BaseException, limit: int = 300) -> str:
    """``exc``'s message (at most ``limit`` characters) and where in the policy it was raised (:func:`policy_line`)."""
    from ratchet.rollout import policy_line

    try:
        text = str(exc)[:limit]
    except Exception:  # noqa: BLE001 - a policy's exception may fail in __str__ too
        text = "<unprintable>"
    return text + policy_line(exc)


def _task_or_none(task_dict: Any) -> Any:
    try:
        from ratchet.tasks import task_from_dict

        return task_from_dict(task_dict)
    except Exception:  # noqa: BLE001 - only names the task in an error reply; a bad task dict gives None
        return None


if __name__ == "__main__":
    if "RATCHET_POLICY_FDS" in os.environ:
        from ratchet.execution.channel import Channel

        read_fd, write_fd, ctl_fd = map(int, os.environ.pop("RATCHET_POLICY_FDS").split(","))
        policy_main(Channel(read_fd, write_fd, max_message=1 << 30), ctl_fd)
    else:
        from multiprocessing.connection import Connection

        worker_main(Connection(int(os.environ.pop("RATCHET_WORKER_FD"))))
