"""The ledger: an append-only log of typed events; a run's state is a projection of it."""

from __future__ import annotations

from typing import Any, Protocol

from ratchet.ledger.events import Event, EventType
from ratchet.ledger.sqlite import SQLiteLedger

__all__ = ["Event", "EventType", "LedgerStore", "SQLiteLedger"]


class LedgerStore(Protocol):
    """What a ledger backend provides. Appends are idempotent by key."""

    def append(self, type: EventType, key: str, payload: dict[str, Any]) -> tuple[Event, bool]:
        """Append unless ``key`` exists; return (stored event, created)."""

    def get(self, key: str) -> Event | None:
        """The event with this key, or None."""

    def read(self, from_seq: int = 0) -> list[Event]:
        """Events after ``from_seq`` in order."""

    def close(self) -> None:
        """Release resources."""
