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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.policy import Candidate

__all__ = ["TrainingJob", "TrainingOutput", "TrainingResult", "TRAINERS", "run_training"]

#: Trainer name -> ``"module:function"``. A refiner kind registers its trainer here (see ``refiners/``).
TRAINERS: dict[str, str] = {
    "ppo": "ratchet.refiners.ppo:train",
    "residual": "ratchet.refiners.ppo:train",
    "dagger": "ratchet.refiners.dagger:train",
}

_MAX_HEADER_BYTES = 1 << 20
_MAX_OUTPUT_BYTES = 1 << 30


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
    """

    trainer: str
    parent: Candidate
    settings: Mapping[str, Any]
    seeds: tuple[int, ...]
    env_steps: int
    artifacts: Mapping[str, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)

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
    size}}]}``; then each output's artifact bytes in header order."""
    (n,) = struct.unpack("!I", _read_exact(fd, 4, deadline))
    if n > _MAX_HEADER_BYTES:
        raise _Failed(f"trainer sent a header of {n:,} bytes")
    try:
        header = json.loads(_read_exact(fd, n, deadline))
        if header.get("error"):
            raise _Failed(str(header["error"])[:500])
        outs, total = [], 0
        for o in header["outputs"]:
            arts = {}
            for role, size in o["artifacts"].items():
                size = int(size)
                total += size
                if not isinstance(role, str) or size < 0 or total > _MAX_OUTPUT_BYTES:
                    raise _Failed("trainer sent malformed artifacts")
                arts[role] = _read_exact(fd, size, deadline)
            info = o.get("info", {})
            if not isinstance(info, dict):
                raise _Failed("trainer sent malformed info")
            outs.append(TrainingOutput(arts, json.loads(json.dumps(info))))
    except _Failed:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
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
    from ratchet.task import GymTask

    try:
        module, _, fn = TRAINERS[trainer].partition(":")
        outputs, _ = getattr(importlib.import_module(module), fn)(GymTask.from_dict(task_dict), parent, settings,
                                                                  seeds, env_steps)
        header = {"error": None, "outputs": [{"info": dict(o.info), "artifacts": {r: len(b) for r, b in o.artifacts.items()}}
                                             for o in outputs]}
        body = [b for o in outputs for b in o.artifacts.values()]
    except Exception as exc:
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
