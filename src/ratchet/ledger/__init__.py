"""The ledger: an append-only log of typed events; a run's state is a projection of it.

Two stores implement :class:`LedgerStore`: :class:`SQLiteLedger` (one SQLite file per run, the
default) and :class:`SQLAlchemyLedger` (many runs in one PostgreSQL or SQLite database, imported on
first use). :func:`ratchet.ledger.storage.open_store` picks one from a ``--storage`` value. Each store
also keeps its runs' writer leases (:mod:`ratchet.ledger.lease`): one writer per run, across machines.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from ratchet.ledger.events import Event, EventType
from ratchet.ledger.lease import LeaseHolder, LeaseInfo, WriterLease
from ratchet.ledger.sqlite import SQLiteLedger

if TYPE_CHECKING:
    from ratchet.ledger.sql import SQLAlchemyLedger

__all__ = ["Event", "EventType", "LeaseHolder", "LeaseInfo", "LedgerStore", "SQLAlchemyLedger", "SQLiteLedger",
           "WriterLease"]


class LedgerStore(Protocol):
    """What a ledger backend provides. Appends are idempotent by key.

    Attributes:
        location: Where the ledger is, for messages (a file path, or a run id and a URL without its
            password).
    """

    location: str

    def append(self, type: EventType, key: str, payload: dict[str, Any]) -> tuple[Event, bool]:
        """Append unless ``key`` exists; return (stored event, created)."""

    def append_many(self, events: Any) -> list[tuple[Event, bool]]:
        """:meth:`append` each ``(type, key, payload)`` of ``events``, in order; a store may commit them together
        (all or none)."""

    def get(self, key: str) -> Event | None:
        """The event with this key, or None."""

    def read(self, from_seq: int = 0, types: Collection[EventType] | None = None) -> list[Event]:
        """Events after ``from_seq`` in order; with ``types``, only events of those types (a reader that needs a
        few kinds, such as ``ratchet dashboard``, skips the rest in the store)."""

    def tail(self, types: Collection[EventType] | None = None) -> Event | None:
        """The newest event (of ``types``, when given), or None when there is none."""

    def put_artifact(self, data: bytes) -> str:
        """Store immutable bytes (idempotent); returns their SHA-256 hex digest (:mod:`ratchet.ledger.artifacts`)."""

    def get_artifact(self, name: str) -> bytes:
        """The bytes stored under digest ``name``; raises LedgerError when missing or damaged."""

    def acquire_lease(self, holder: LeaseHolder, ttl_s: float, *, take_over: str | None = None) -> LeaseInfo:
        """Take the run's writer lease (atomic compare-and-set in the store) unless another holder's is
        live, i.e. neither expired (``ttl_s`` seconds without a heartbeat, on the store's clock) nor
        released; ``take_over`` names a holder token to take it from regardless. Once taken, this
        instance's appends are fenced on it (they raise :class:`~ratchet.errors.WriterLeaseError` once
        another process took the lease over). Returns the lease as stored: ours iff its token is
        ``holder.token``."""

    def renew_lease(self, holder: LeaseHolder, ttl_s: float) -> bool:
        """Heartbeat (callable from another thread): expiry = now + ``ttl_s`` seconds; False if lost."""

    def release_lease(self, holder: LeaseHolder) -> None:
        """Give the lease up if ``holder`` still has it."""

    def read_lease(self) -> LeaseInfo | None:
        """The run's writer lease (holder, last heartbeat, expiry, the store's now), or None if none was taken."""

    def close(self) -> None:
        """Release resources."""


def __getattr__(name: str) -> Any:
    if name == "SQLAlchemyLedger":  # SQLAlchemy loads only when a database store is used
        from ratchet.ledger.sql import SQLAlchemyLedger

        return SQLAlchemyLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
