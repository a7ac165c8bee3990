"""Exception hierarchy: one root (:class:`RatchetError`), one subclass per kind of user-facing problem.

Every message is one line that says what is wrong and how to fix it. The CLI prints it and exits
non-zero; tracebacks appear only with ``--debug``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ApiKeyNotSetError",
    "EndpointError",
    "FixedOutsideError",
    "LedgerError",
    "PolicyError",
    "RatchetError",
    "ReplayMismatchError",
    "RunNotFoundError",
    "SpecError",
    "StorageNotNamedError",
    "TaskError",
    "WriterLeaseError",
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


class StorageNotNamedError(LedgerError):
    """A run directory's ``ledger.json`` points to a database the command does not name (``--storage``), so it was
    not opened: a pointer is a file in a runs folder, and following it would send the user's database password
    (``PGPASSWORD``, ``~/.pgpass``) to whatever host it names.

    Attributes:
        where: The pointer's database URL (no password), as the file says.
        run: The run directory's name.
    """

    def __init__(self, where: str, run: str) -> None:
        super().__init__(f"run {run} is kept in database {where}: not opened, as this command does not name it (a "
                         "ledger.json is followed only to the database --storage names); if that database is yours, "
                         "pass --storage URL (or set RATCHET_STORAGE) to open it")
        self.where, self.run = where, run


class RunNotFoundError(RatchetError):
    """No run with the given id or directory exists."""


class ReplayMismatchError(RatchetError):
    """A replayed episode did not reproduce the return recorded in the ledger."""


class SandboxError(RatchetError):
    """The sandbox cannot give what the spec requires (``require_isolation = true``), or a worker
    process cannot be started under it."""


class FixedOutsideError(RatchetError):
    """Something outside ratchet stopped a run, and the run resumes once the user fixes it (an endpoint, an
    environment variable). The loop sets :attr:`resume`, the command that continues the run (e.g. ``ratchet resume
    runs/ID``), when it stops one; the message then ends with it."""

    resume: str | None = None

    def __str__(self) -> str:
        message = super().__str__()
        return message if self.resume is None else f"{message}; once it is fixed, continue with `{self.resume}`"


class EndpointError(FixedOutsideError):
    """An outside service a refiner needs (an LLM endpoint) cannot serve the run: unreachable, it refuses
    the key, does not know the model, or failed request after request. The message says what to fix.

    Raised at the start of a run (before the run exists: its message says to run again once fixed) or by a
    refiner's ``propose`` when it stops: beside other refiners the run goes on without it; alone, the run stops
    unfinished and ``ratchet resume`` continues it once the service works (the loop ends the message with the
    run to resume). ``proposals`` holds what the refiner proposed before it stopped.
    """

    def __init__(self, message: str, proposals: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.proposals = list(proposals)


class ApiKeyNotSetError(FixedOutsideError):
    """The environment variable a refiner reads its API key from (``api_key_env``) is not set. Raised by the
    endpoint check before a new run exists (export it and run again), or by a running run's refiner when it needs
    the key (nothing is recorded: the run stops and ``ratchet resume`` continues it once the variable is set)."""
