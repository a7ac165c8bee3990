"""Exception hierarchy: one root (:class:`RatchetError`), one subclass per kind of user-facing problem.

Every message is one line that says what is wrong and how to fix it. The CLI prints it and exits
non-zero; tracebacks appear only with ``--debug``.
"""

from __future__ import annotations

__all__ = [
    "RatchetError",
    "PolicyError",
    "SpecError",
    "TaskError",
    "LedgerError",
    "WriterLeaseError",
    "RunNotFoundError",
    "ReplayMismatchError",
]


class RatchetError(Exception):
    """Root of every error ratchet raises on purpose."""


class PolicyError(RatchetError):
    """A policy file is missing or malformed (syntax error, no ``act``, bad ``PARAMETERS``)."""


class SpecError(RatchetError):
    """A run spec (``ratchet.toml``) is invalid: unknown key, wrong type, missing or unknown env id."""


class TaskError(RatchetError):
    """A task cannot be built (for example an unknown Gymnasium id or bad env keyword arguments)."""


class LedgerError(RatchetError):
    """A run's ledger is unreadable, or a resumed run diverged from what its ledger recorded."""


class WriterLeaseError(LedgerError):
    """Another process holds a run's writer lease (it is being written elsewhere), or took it over
    from this one (which must then stop writing)."""


class RunNotFoundError(RatchetError):
    """No run with the given id or directory exists."""


class ReplayMismatchError(RatchetError):
    """A replayed episode did not reproduce the return recorded in the ledger."""


class SandboxError(RatchetError):
    """The sandbox cannot give what the spec requires (``require_isolation = true``), or a worker
    process cannot be started under it."""
