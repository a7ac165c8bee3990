"""Sandboxing for policy code: how worker processes are launched and what they may do.

Policy code is untrusted (it may come from an LLM). Every worker process that runs it is started
through :meth:`Sandbox.command` and confines itself with :func:`confine` before it reads its first
job. Layers, strongest first:

* **bubblewrap** (``bwrap``, Debian package ``bubblewrap``) when it is on ``PATH`` and works: the
  whole filesystem read-only except the worker's fresh temporary directory, new network, PID, IPC
  and UTS namespaces (no route to the host's network, loopback included), all capabilities dropped,
  the sandbox dies with its parent.
* otherwise a new **network namespace** through ``unshare(2)`` where the kernel allows it.
* always: resource limits (address space, CPU time, open files, processes), an environment reduced
  to an allow-list (API keys never reach policy code), and a fresh temporary working directory.

Where the process limit cannot be enforced by ``RLIMIT_NPROC`` (root is exempt from it), a cgroup-v1
``pids`` controller is used when it is writable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sandbox"]


@dataclass(frozen=True)
class Sandbox:
    """How worker processes that run policy code are confined. Picklable (it travels to Ray workers).

    Args:
        enabled: False runs workers unconfined (only for measuring the sandbox's cost).
        require_isolation: Refuse to start workers unless policy code gets its own network namespace.
        memory_limit_mb: ``RLIMIT_AS`` per worker process, in MiB.
        cpu_limit_s: ``RLIMIT_CPU`` per worker process, in seconds of CPU time.
        max_open_files: ``RLIMIT_NOFILE`` per worker process.
        max_processes: Processes a worker may hold at once, itself included (fork-bomb bound).
        env_allowlist: Extra environment variables passed through to workers.
    """

    enabled: bool = True
    require_isolation: bool = False
    memory_limit_mb: int = 4096
    cpu_limit_s: int = 3600
    max_open_files: int = 256
    max_processes: int = 64
    env_allowlist: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_spec(cls, execution: Any) -> Sandbox:
        """Build from a spec's ``[execution]`` section (:class:`ratchet.spec.ExecutionSpec`)."""
        return cls(enabled=execution.sandbox, require_isolation=execution.require_isolation,
                   memory_limit_mb=execution.memory_limit_mb, cpu_limit_s=execution.cpu_limit_s,
                   max_open_files=execution.max_open_files, max_processes=execution.max_processes,
                   env_allowlist=tuple(execution.env_allowlist))
