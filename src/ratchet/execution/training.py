"""Training jobs: a refiner's work that is not an episode (PPO updates, behaviour cloning), run in a
sandboxed process because it runs policy code (a residual policy's base program) or opens pickles
(Stable-Baselines3 zips).

A :class:`TrainingJob` names a *trainer* — a function registered in :data:`TRAINERS` by a refiner
module, ``train(task, parent, settings, seeds, env_steps) -> (outputs, env_steps_used)`` — the parent
candidate with its artifact bytes, JSON-ready settings, training seeds and an env-step allowance.
:func:`run_training` starts ``python -m ratchet.execution.training`` with the worker's sandbox (same
launcher, limits, network namespace, private directory), sends it the job (the trusted direction:
pickle), and reads the answer back without unpickling it: a length-prefixed JSON header followed by
raw artifact bytes, size-capped and under a deadline. Whatever the sandboxed trainer says is used
only to *propose* candidates: every candidate still passes trusted rollouts and the gate, and the
env steps charged to the budget are the job's allowance, never a number the trainer reports.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.execution.replies import BadReply, decode_reply, key_mismatch
from ratchet.policy import Candidate
from ratchet.text import clean

__all__ = [
    "TRAINERS",
    "BadAnswer",
    "InfoField",
    "Role",
    "TrainingAnswer",
    "TrainingJob",
    "TrainingOutput",
    "TrainingResult",
    "accept",
    "run_training",
]

#: Trainer name -> ``"module:function"``. A refiner kind registers its trainer here (see ``refiners/``).
TRAINERS: dict[str, str] = {
    "ppo": "ratchet.refiners.ppo:train",
    "residual": "ratchet.refiners.ppo:train",
    "dagger": "ratchet.refiners.dagger:train",
    "cfr": "ratchet.refiners.cfr:train",
    "worldmodel": "ratchet.refiners.screened:train",
}

_MAX_HEADER_BYTES = 1 << 20
_MAX_OUTPUT_BYTES = 1 << 30
_MAX_OUTPUTS = 1000


@dataclass(frozen=True)
class TrainingJob:
    """One training job.

    Attributes:
        trainer: A name in :data:`TRAINERS`.
        parent: The candidate training starts from.
        settings: JSON-ready hyperparameters (the refiner's spec table, plus anything it adds).
        seeds: Training seeds (episode resets cycle through them).
        env_steps: Env steps of training allowed (charged to the budget in full).
        artifacts: The parent's artifact bytes by digest.
        answer: What the trainer declares it returns (checked by :func:`accept` before anything records or
            uses the answer); not part of the job's key.
    """

    trainer: str
    parent: Candidate
    settings: Mapping[str, Any]
    seeds: tuple[int, ...]
    env_steps: int
    artifacts: Mapping[str, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)
    answer: TrainingAnswer | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def key(self) -> str:
        """Content digest (16 hex chars) of what determines the job's result."""
        blob = json.dumps([self.trainer, self.parent.id, dict(self.settings), list(self.seeds), self.env_steps],
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrainingOutput:
    """One checkpoint a trainer proposes: new artifact bytes by role (the parent's other roles, source and
    parameters are kept), and JSON-ready notes (e.g. the training return it saw, env steps so far)."""

    artifacts: Mapping[str, bytes]
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingResult:
    """What a training job gave: its checkpoints (empty when it failed), the env steps it was allowed,
    and why it failed (None on success)."""

    outputs: tuple[TrainingOutput, ...]
    env_steps: int
    error: str | None = None
    seconds: float = 0.0


class BadAnswer(Exception):
    """A training answer breaks its trainer's declaration (:class:`TrainingAnswer`); ``str(exc)`` is one line."""


@dataclass(frozen=True)
class Role:
    """An artifact role a trainer's outputs carry.

    Attributes:
        name: The role (``"weights"``, ``"dataset"``, ...).
        required: Every output carries it (else it may).
        max_bytes: Largest artifact of this role, in bytes.
        check: Reads the bytes in the driver and raises on a malformed artifact (never unpickles; e.g.
            :func:`ratchet.policies.mlp.load_weights`); None: only the size is checked.
    """

    name: str
    required: bool = True
    max_bytes: int = 1 << 28
    check: Callable[[bytes], Any] | None = None


#: A bound of an :class:`InfoField`: a number, or a function of the job (e.g. its env-step allowance).
Bound = float | Callable[["TrainingJob"], float] | None


@dataclass(frozen=True)
class InfoField:
    """One entry of an output's ``info``.

    Attributes:
        name: Its key.
        kind: ``"int"``, ``"float"`` (finite; ints accepted), ``"bool"``, ``"str"``, ``"list"`` or ``"dict"``.
        required: Every output has it.
        nullable: ``None`` is accepted.
        low, high: Inclusive bounds of a number, or of a list's / string's length; a callable gets the job.
        choices: The values accepted (for ``"str"``).
        check: Further check of the value (raises ``ValueError``/``TypeError``/``KeyError`` on a bad one), e.g.
            the structure of a list of records.
    """

    name: str
    kind: str
    required: bool = True
    nullable: bool = False
    low: Bound = None
    high: Bound = None
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class TrainingAnswer:
    """What a trainer declares it returns; the driver checks each answer against it (:func:`accept`) before the
    answer is recorded or used.

    Attributes:
        roles: The artifact roles of each output (no others are accepted).
        info: The entries of each output's ``info`` (no others are accepted).
        min_outputs, max_outputs: How many outputs a successful job gives (``max_outputs`` may be a function
            of the job).
        max_info_bytes: Largest ``info`` of one output, as JSON, in bytes.
    """

    roles: tuple[Role, ...]
    info: tuple[InfoField, ...] = ()
    min_outputs: int = 1
    max_outputs: int | Callable[[TrainingJob], int] = 1
    max_info_bytes: int = 1 << 20

    def check(self, job: TrainingJob, outputs: Sequence[TrainingOutput]) -> None:
        """Check ``outputs`` of ``job`` against the declaration.

        Raises:
            BadAnswer: the first thing that breaks it, in one line.
        """
        most = self.max_outputs(job) if callable(self.max_outputs) else self.max_outputs
        if not self.min_outputs <= len(outputs) <= most:
            raise BadAnswer(f"{len(outputs)} outputs (expected {self.min_outputs}..{most})")
        roles = {r.name: r for r in self.roles}
        fields = {f.name: f for f in self.info}
        for i, out in enumerate(outputs):
            where = f"output {i + 1}"
            arts = out.artifacts
            wrong = key_mismatch(arts, roles, [r.name for r in self.roles if r.required])
            if wrong is not None:
                raise BadAnswer(f"{where} with the wrong artifacts ({wrong})")
            for name, data in arts.items():
                role = roles[name]
                if not isinstance(data, bytes) or len(data) > role.max_bytes:
                    size = f"{len(data):,} bytes" if isinstance(data, bytes) else type(data).__name__
                    raise BadAnswer(f"{where}: artifact {name!r} of {size} (at most {role.max_bytes:,} bytes)")
                if role.check is not None:
                    try:
                        role.check(data)
                    except Exception as exc:  # noqa: BLE001 - a check failing in any way means the trainer's answer is bad
                        raise BadAnswer(f"{where}: artifact {name!r}: {clean(str(exc) or type(exc).__name__, 200)}"
                                        ) from None
            info = out.info
            if not isinstance(info, Mapping):
                raise BadAnswer(f"{where}: info of type {type(info).__name__} (expected an object)")
            try:
                info_bytes = len(json.dumps(info, allow_nan=False))
            except (TypeError, ValueError, RecursionError):
                raise BadAnswer(f"{where}: info that is not finite JSON") from None
            if info_bytes > self.max_info_bytes:
                raise BadAnswer(f"{where}: {info_bytes:,} bytes of info (at most {self.max_info_bytes:,})")
            wrong = key_mismatch(info, fields, [f.name for f in self.info if f.required])
            if wrong is not None:
                raise BadAnswer(f"{where}: info with the wrong keys ({wrong})")
            for key, value in info.items():
                _check_field(fields[key], value, job, where)


_KINDS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,),
                                       "list": (list,), "dict": (dict,)}


def _check_field(f: InfoField, value: Any, job: TrainingJob, where: str) -> None:
    if value is None and f.nullable:
        return
    shown = clean(repr(value), 40)
    if (isinstance(value, bool) and f.kind != "bool") or not isinstance(value, _KINDS[f.kind]):
        raise BadAnswer(f"{where}: info {f.name!r} = {shown} (expected {'null or ' if f.nullable else ''}{f.kind})")
    if f.choices is not None and value not in f.choices:
        raise BadAnswer(f"{where}: info {f.name!r} = {shown} (expected one of {list(f.choices)})")
    measure: Any = value  # of the kind checked above
    if f.kind in ("list", "str", "dict"):
        measure = len(measure)
    low = f.low(job) if callable(f.low) else f.low
    high = f.high(job) if callable(f.high) else f.high
    if f.kind in ("int", "float") and not math.isfinite(measure):
        raise BadAnswer(f"{where}: info {f.name!r} = {shown} (expected a finite number)")
    if (low is not None and measure < low) or (high is not None and measure > high):
        what = "of length " if f.kind in ("list", "str", "dict") else "in "
        raise BadAnswer(f"{where}: info {f.name!r} = {shown} (expected {f.kind} {what}"
                        f"{'-inf' if low is None else f'{low:g}'}..{'inf' if high is None else f'{high:g}'})")
    if f.check is not None:
        try:
            f.check(value)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise BadAnswer(f"{where}: info {f.name!r}: {clean(str(exc) or type(exc).__name__, 200)}") from None


def accept(job: TrainingJob, result: Any) -> TrainingResult:
    """``result`` when it is a :class:`TrainingResult` whose outputs fit ``job.answer``; otherwise a failed result
    (no outputs, the job's env-step allowance, a one-line ``error`` saying what was wrong). Never raises: an
    answer that cannot even be inspected is a failure too.

    Args:
        job: The job that was run (its ``answer`` is the trainer's declaration).
        result: What the executor returned for it.
    """
    try:
        if not isinstance(result, TrainingResult):
            raise BadAnswer(f"a result of type {type(result).__name__}")
        if result.error is not None:
            return TrainingResult((), job.env_steps, clean(str(result.error), 500), float(result.seconds))
        if job.answer is None:
            raise BadAnswer("no declaration to check it against (TrainingJob.answer is None)")
        job.answer.check(job, result.outputs)
        return TrainingResult(tuple(result.outputs), job.env_steps, None, float(result.seconds))
    except BadAnswer as exc:
        why = f"trainer {job.trainer!r} sent an answer that breaks its declaration: {exc}"
    except Exception as exc:  # noqa: BLE001 - any failure to read the answer is the job's failure
        why = f"trainer {job.trainer!r} sent an answer that cannot be read ({type(exc).__name__})"
    seconds = getattr(result, "seconds", 0.0)
    return TrainingResult((), job.env_steps, why, float(seconds) if isinstance(seconds, (int, float)) else 0.0)


def run_training(sandbox: Any, task: Any, job: TrainingJob, timeout_s: float) -> TrainingResult:
    """Run ``job`` in a fresh sandboxed process and read its answer (never unpickled).

    Args:
        sandbox: The :class:`~ratchet.execution.sandbox.Sandbox` the executor's workers use.
        task: The task (its dict travels to the trainer).
        job: The job.
        timeout_s: Wall-clock limit, in seconds (also the CPU-time limit of the process).

    Returns:
        The result; a trainer that crashes, times out or answers garbage gives a result with ``error`` set
        and no outputs (a recorded outcome, never an exception).
    """
    from dataclasses import replace

    from ratchet.execution.sandbox import remove_cgroup

    t0 = time.monotonic()
    sb = replace(sandbox, cpu_limit_s=max(int(sandbox.cpu_limit_s), int(timeout_s) + 1))
    workdir = tempfile.mkdtemp(prefix=f"ratchet-train-{os.getpid()}-")
    sb.prepare_workdir(workdir)
    cgroup = sb.make_cgroup()
    log_path = os.path.join(workdir, "trainer.log")
    parent = {"kind": job.parent.kind, "source": job.parent.source, "params": dict(job.parent.params),
              "artifacts": {role: bytes(job.artifacts[h]) for role, h in job.parent.artifacts.items()}}
    message = pickle.dumps((job.trainer, task.to_dict(), parent, dict(job.settings), list(job.seeds), job.env_steps))
    env = sb.environment(workdir, {"RATCHET_PARENT_PID": str(os.getpid())}, cgroup)
    argv = sb.command([sys.executable, "-m", "ratchet.execution.training"], workdir, cgroup)
    outputs: tuple[TrainingOutput, ...] = ()
    error: str | None = None
    proc = None
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, env=env, cwd=workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None  # both are PIPEs
        try:
            proc.stdin.write(message)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        deadline = time.monotonic() + timeout_s
        try:
            outputs = _read_answer(proc.stdout.fileno(), deadline)
            if proc.wait(max(1.0, deadline - time.monotonic())) != 0:
                outputs, error = (), f"trainer exit code {proc.returncode}"
        except _Failed as exc:
            error = str(exc)
        except subprocess.TimeoutExpired:
            error = f"trainer did not exit within {timeout_s:g} s"
    except OSError as exc:
        error = f"trainer could not start: {exc}"
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
        if error is not None and (tail := _last_line(log_path)) and tail not in error:
            error = f"{error}: {tail}"
        if cgroup is not None:
            remove_cgroup(cgroup)
        shutil.rmtree(workdir, ignore_errors=True)
    return TrainingResult(tuple(outputs), job.env_steps, error, time.monotonic() - t0)


class _Failed(Exception):
    pass


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Failed("trainer timed out")
        if not select.select([fd], [], [], remaining)[0]:
            raise _Failed("trainer timed out")
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise _Failed("trainer died")
        buf += chunk
    return bytes(buf)


def _read_answer(fd: int, deadline: float) -> tuple[TrainingOutput, ...]:
    """Header: 4-byte length + JSON ``{"error": str|None, "outputs": [{"info": {...}, "artifacts": {role:
    size}}]}``; then each output's artifact bytes in header order. Only the framing is checked here (sizes
    are ints within the caps, roles are text, info is an object); what the answer holds is checked against
    the trainer's declaration by :func:`accept`.

    Raises:
        _Failed: the answer is malformed (any exception while decoding it is one), or the trainer's own error.
    """
    (n,) = struct.unpack("!I", _read_exact(fd, 4, deadline))
    if n > _MAX_HEADER_BYTES:
        raise _Failed(f"trainer sent a header of {n:,} bytes (at most {_MAX_HEADER_BYTES:,})")
    try:
        header = decode_reply(_read_exact(fd, n, deadline))
        if not isinstance(header, dict) or not isinstance(header.get("outputs"), list):
            raise _Failed("trainer sent a malformed answer (expected an object with a list of outputs)")
        if header.get("error"):
            raise _Failed(clean(str(header["error"]), 500))
        if len(header["outputs"]) > _MAX_OUTPUTS:
            raise _Failed(f"trainer sent {len(header['outputs']):,} outputs (at most {_MAX_OUTPUTS})")
        outs, total = [], 0
        for o in header["outputs"]:
            if not isinstance(o, dict) or not isinstance(o.get("artifacts"), dict) or \
                    not isinstance(o.get("info", {}), dict):
                raise _Failed("trainer sent a malformed output (expected {\"info\": {...}, \"artifacts\": {...}})")
            arts = {}
            for role, size in o["artifacts"].items():
                if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= _MAX_OUTPUT_BYTES - total:
                    raise _Failed(f"trainer sent an artifact {clean(repr(role), 40)} of size {clean(repr(size), 40)} "
                                  f"(expected an int in 0..{_MAX_OUTPUT_BYTES - total:,})")
                total += size
                arts[role] = _read_exact(fd, size, deadline)
            outs.append(TrainingOutput(arts, o.get("info", {})))
    except _Failed:
        raise
    except BadReply as exc:
        raise _Failed(f"trainer sent {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the answer holds, decoding it never raises past here
        raise _Failed(f"trainer sent a malformed answer ({type(exc).__name__})") from None
    return tuple(outs)


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 2000))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""
    except OSError:
        return ""


def _main() -> None:
    """The sandboxed trainer process: read the job from stdin, run the trainer, write the answer."""
    from ratchet.execution.worker import _start

    sandbox = json.loads(os.environ.pop("RATCHET_SANDBOX")) if "RATCHET_SANDBOX" in os.environ else None
    out = os.fdopen(os.dup(1), "wb")
    _start(sandbox)  # confines, and points sys.stdout at /dev/null: only `out` answers
    trainer, task_dict, parent, settings, seeds, env_steps = pickle.loads(sys.stdin.buffer.read())
    from ratchet.tasks import task_from_dict

    try:
        module, _, fn = TRAINERS[trainer].partition(":")
        outputs, _ = getattr(importlib.import_module(module), fn)(task_from_dict(task_dict), parent, settings,
                                                                  seeds, env_steps)
        header: dict[str, Any] = {"error": None, "outputs": [{"info": dict(o.info), "artifacts": {r: len(b) for r, b in o.artifacts.items()}}
                                             for o in outputs]}
        body = [b for o in outputs for b in o.artifacts.values()]
    except Exception as exc:  # noqa: BLE001 - a failing trainer is an outcome sent to the driver
        import traceback

        traceback.print_exc()
        header, body = {"error": f"{type(exc).__name__}: {exc}"[:500], "outputs": []}, []
    data = json.dumps(header).encode()
    out.write(struct.pack("!I", len(data)) + data)
    for b in body:
        out.write(b)
    out.flush()


if __name__ == "__main__":
    _main()
