"""SQLite ledger store: one file per run, append-only, WAL mode."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from ratchet.errors import LedgerError
from ratchet.ledger.events import Event, EventType

__all__ = ["SQLiteLedger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    time REAL NOT NULL,
    payload TEXT NOT NULL
);
"""


class SQLiteLedger:
    """Append-only event log in a SQLite file.

    Appends are durable when :meth:`append` returns (each is its own transaction), so a run killed
    with ``kill -9`` loses nothing it had recorded. Appending an event whose ``key`` already exists
    changes nothing and returns the stored event (that is what makes resuming idempotent).

    Args:
        path: The database file (created if missing, with its parent directory when ``create``).
        create: Allow creating a new file; with False a missing file raises.
        readonly: Open the file read-only (appends raise :class:`LedgerError`; the file is never modified).

    Attributes:
        path: The database file.
        location: The file, as a string (for messages; the same attribute every store has).

    Raises:
        LedgerError: the file is missing (``create=False``) or is not a ratchet ledger.
    """

    def __init__(self, path: str | Path, *, create: bool = True, readonly: bool = False) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        if (not create or readonly) and not self.path.is_file():
            raise LedgerError(f"no ledger at {self.path}")
        try:
            if readonly:  # never modify the file (a damaged ledger stays as it is)
                self._db = sqlite3.connect(f"file:{self.path.resolve()}?mode=ro", uri=True, timeout=30,
                                           isolation_level=None)
                self._db.execute("SELECT seq, type, key, time, payload FROM events LIMIT 1").fetchall()
            else:
                if create:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
                if not create:  # an existing ledger must already be one: never write a schema into another file
                    self._db.execute("SELECT seq, type, key, time, payload FROM events LIMIT 1").fetchall()
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"{self.path} is not a readable ratchet ledger: {exc}") from None

    def append(self, type: EventType, key: str, payload: dict[str, Any]) -> tuple[Event, bool]:
        """Append one event unless its key exists.

        Returns:
            ``(event, created)``: the stored event and whether this call created it.

        Raises:
            LedgerError: the ledger is read-only or the write failed.
        """
        existing = self.get(key)
        if existing is not None:
            return existing, False
        now = time.time()
        body = json.dumps(payload, separators=(",", ":"))
        try:
            cur = self._db.execute("INSERT INTO events(key, type, time, payload) VALUES (?, ?, ?, ?)",
                                   (key, type.value, now, body))
        except sqlite3.IntegrityError:  # another writer won the race
            stored = self.get(key)
            assert stored is not None
            return stored, False
        except sqlite3.Error as exc:  # read-only, disk full, locked for longer than the timeout
            raise LedgerError(f"cannot append to ledger {self.path}: {exc}") from None
        return Event(int(cur.lastrowid), type, key, now, payload), True

    def get(self, key: str) -> Event | None:
        """The event with this key, or None."""
        try:
            row = self._db.execute("SELECT seq, type, key, time, payload FROM events WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        return None if row is None else self._row(row)

    def read(self, from_seq: int = 0) -> list[Event]:
        """All events with ``seq > from_seq``, in order.

        Raises:
            LedgerError: the file is damaged (unreadable rows, bad JSON, unknown event types).
        """
        try:
            rows = self._db.execute("SELECT seq, type, key, time, payload FROM events WHERE seq > ? ORDER BY seq",
                                    (from_seq,)).fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        return [self._row(r) for r in rows]

    def _row(self, row: tuple) -> Event:
        try:
            return Event(row[0], EventType(row[1]), row[2], row[3], json.loads(row[4]))
        except (ValueError, TypeError) as exc:
            raise LedgerError(f"ledger {self.path} is damaged at event {row[0]}: {exc}") from None

    def close(self) -> None:
        """Close the connection."""
        self._db.close()
