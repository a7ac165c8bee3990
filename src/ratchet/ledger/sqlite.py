"""SQLite ledger store: one file per run, append-only, WAL mode.

A ledger file is read as input like any other: before any query its schema must be the one ratchet writes (its
tables ``events``, ``artifacts`` and ``lease`` exactly as created here, with no view, trigger or index of another
making in their place or on them), and every read is bounded in SQLite's steps by the file's size, so that no file
(a recursive view in place of ``events``, say) makes a command hang or grow without end.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ratchet.errors import LedgerError, WriterLeaseError
from ratchet.ledger.artifacts import check_artifact, check_size, digest
from ratchet.ledger.events import Event, EventType, event_from_row

if TYPE_CHECKING:
    from ratchet.ledger.lease import LeaseHolder, LeaseInfo

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

# Content-addressed artifacts (see ratchet.ledger.artifacts), created with the first one stored.
_ARTIFACT_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    hash TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    data BLOB NOT NULL
)
"""

# The run's writer lease (see ratchet.ledger.lease): at most one row. Created by the first writer that
# takes a lease, so opening a ledger never writes it and older files without it stay readable.
_LEASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    token TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    released INTEGER NOT NULL DEFAULT 0
)
"""


#: A read may take SQLite this many virtual-machine steps, plus :data:`_STEPS_PER_BYTE` per byte of the file and its
#: write-ahead log: reading a table of that size takes far fewer (about one step per 10 bytes), so only a file built
#: to make reads endless reaches it.
_STEPS_BASE = 10_000_000
_STEPS_PER_BYTE = 100
_STEPS_PER_CHECK = 10_000  # SQLite calls the progress handler this often


@functools.cache
def _ratchet_tables() -> dict[str, str]:
    """Each table ratchet writes in a ledger file, by name, and the SQL SQLite keeps for it (``sqlite_master.sql``)."""
    con = sqlite3.connect(":memory:")
    try:
        for schema in (_SCHEMA, _ARTIFACT_SCHEMA, _LEASE_SCHEMA):
            con.execute(schema.strip().rstrip(";"))
        return {name: sql for name, sql in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                                                         "AND name NOT LIKE 'sqlite_%'")}
    finally:
        con.close()


def _type_filter(types: Collection[EventType] | None) -> tuple[str, list[str]]:
    """An SQL condition (`` AND type IN (?, ...)``) and its arguments for :meth:`SQLiteLedger.read`'s ``types``."""
    if types is None:
        return "", []
    names = sorted({EventType(t).value for t in types})
    return (f" AND type IN ({', '.join('?' * len(names))})", names) if names else (" AND 0", [])


def _restore_wal(path: Path, saved: bytes | None) -> None:
    """Write ``path``'s write-ahead log back as ``saved`` (its bytes before a connection that could not read the
    ledger): SQLite drops a log whose checksums fail when its last connection closes, and that log may hold every
    event of a run killed before its first checkpoint. Nothing to do without a log before or when it is unchanged."""
    wal = Path(f"{path}-wal")
    if saved is not None and (not wal.is_file() or wal.read_bytes() != saved):
        wal.write_bytes(saved)


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
        self._fence: str | None = None  # the token of the lease this instance holds: appends are fenced on it
        self._lease_lost = False
        if (not create or readonly) and not self.path.is_file():
            raise LedgerError(f"no ledger at {self.path}")
        try:
            if readonly:  # never modify the file (a damaged ledger stays as it is)
                self._db = sqlite3.connect(f"file:{self.path.resolve()}?mode=ro", uri=True, timeout=30,
                                           isolation_level=None)
                try:
                    self._check_schema()
                except (sqlite3.Error, LedgerError):
                    self._db.close()
                    raise
            else:
                if create:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                wal = Path(f"{self.path}-wal")
                saved = wal.read_bytes() if not create and wal.is_file() else None
                self._db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
                if not create:  # an existing ledger must already be one: never write a schema into another file
                    try:
                        self._check_schema()
                    except (sqlite3.Error, LedgerError):  # unreadable or not ours: leave its files as they were
                        self._db.close()
                        _restore_wal(self.path, saved)
                        raise
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
                if create:
                    self._check_schema()
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"{self.path} is not a readable ratchet ledger: {exc}") from None

    def _check_schema(self) -> None:
        """Refuse a file whose schema is not ratchet's, before any query reads a table.

        Raises:
            LedgerError: it has no ``events`` table, or one of ratchet's tables is another table, a view or a virtual
                table, or has a trigger or an index of its own (one line naming it).
            sqlite3.Error: the file is not a database.
        """
        tables = _ratchet_tables()
        with self._bounded():
            rows = self._db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        found = set()
        for kind, name, table, sql in rows:
            name, table = str(name).lower(), str(table).lower()
            if kind == "table" and tables.get(name) == sql:
                found.add(name)
            elif (name in tables or table in tables) and not (kind == "index" and sql is None):  # None: a key's own
                raise LedgerError(f"{self.path} is not a ratchet ledger: its {kind} {name!r} is not one ratchet writes "
                                  "(a ledger holds only ratchet's own tables); not reading it")
        if "events" not in found:
            raise LedgerError(f"{self.path} is not a readable ratchet ledger: it has no events table")

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[None]:
        """Bound the statements run in the block to :data:`_STEPS_BASE` plus :data:`_STEPS_PER_BYTE` SQLite steps per
        byte of the file (and its write-ahead log).

        Raises:
            LedgerError: a statement ran past the bound (it is interrupted).
        """
        size = 0
        for f in (self.path, Path(f"{self.path}-wal")):
            with contextlib.suppress(OSError):
                size += os.stat(f).st_size
        bound = _STEPS_BASE + _STEPS_PER_BYTE * size
        left = [bound // _STEPS_PER_CHECK]

        def spent() -> bool:
            left[0] -= 1
            return left[0] < 0

        self._db.set_progress_handler(spent, _STEPS_PER_CHECK)
        try:
            yield
        except sqlite3.OperationalError:
            if left[0] < 0:
                raise LedgerError(f"ledger {self.path} is damaged: a read ran past {bound:,} SQLite steps, far more "
                                  "than reading a ledger of its size takes; not reading it") from None
            raise
        finally:
            self._db.set_progress_handler(None, 0)

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
        try:
            return self._insert(type, key, payload)
        except sqlite3.IntegrityError:  # another writer won the race
            stored = self.get(key)
            assert stored is not None
            return stored, False
        except sqlite3.Error as exc:  # read-only, disk full, locked for longer than the timeout
            raise LedgerError(f"cannot append to ledger {self.path}: {exc}") from None

    def append_many(self, events: Sequence[tuple[EventType, str, dict[str, Any]]]) -> list[tuple[Event, bool]]:
        """Append several events in one transaction (one commit, one ``fsync``), each unless its key exists: all of
        them are stored or, if the write fails, none.

        Returns:
            ``(event, created)`` for each, in order.

        Raises:
            LedgerError: the ledger is read-only, the write failed, or the writer lease was lost (then nothing of
                this call is stored).
        """
        out: list[tuple[Event, bool]] = []
        try:
            with self._transaction():  # no other writer between the key checks and the inserts
                for type, key, payload in events:
                    existing = self.get(key)
                    out.append((existing, False) if existing is not None else self._insert(type, key, payload))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot append to ledger {self.path}: {exc}") from None
        return out

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception (which is re-raised)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _insert(self, type: EventType, key: str, payload: dict[str, Any]) -> tuple[Event, bool]:
        if self._lease_lost:
            raise self._lost_error(key)
        now = time.time()
        body = json.dumps(payload, separators=(",", ":"))
        if self._fence is None:
            cur = self._db.execute("INSERT INTO events(key, type, time, payload) VALUES (?, ?, ?, ?)",
                                   (key, type.value, now, body))
        else:  # one statement: SQLite holds its write lock from the lease check to the insert
            cur = self._db.execute("INSERT INTO events(key, type, time, payload) SELECT ?, ?, ?, ? "
                                   "WHERE EXISTS (SELECT 1 FROM lease WHERE token = ?)",
                                   (key, type.value, now, body, self._fence))
            if cur.rowcount == 0:
                self._lease_lost = True
                raise self._lost_error(key)
        assert cur.lastrowid is not None  # an INSERT that ran sets it
        return Event(cur.lastrowid, type, key, now, payload), True

    def get(self, key: str) -> Event | None:
        """The event with this key, or None."""
        try:
            with self._bounded():
                row = self._db.execute("SELECT seq, type, key, time, payload FROM events WHERE key = ?",
                                       (key,)).fetchone()
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        return None if row is None else self._row(row)

    def read(self, from_seq: int = 0, types: Collection[EventType] | None = None) -> list[Event]:
        """All events with ``seq > from_seq`` (of ``types``, when given), in order.

        Raises:
            LedgerError: the file is damaged (unreadable rows, bad JSON, unknown event types).
        """
        where, args = _type_filter(types)
        try:
            with self._bounded():
                rows = self._db.execute(f"SELECT seq, type, key, time, payload FROM events WHERE seq > ?{where} "
                                        "ORDER BY seq", (from_seq, *args)).fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        return [self._row(r) for r in rows]

    def tail(self, types: Collection[EventType] | None = None) -> Event | None:
        """The newest event (of ``types``, when given), or None.

        Raises:
            LedgerError: the file is damaged.
        """
        where, args = _type_filter(types)
        try:
            with self._bounded():
                row = self._db.execute(f"SELECT seq, type, key, time, payload FROM events WHERE seq > 0{where} "
                                       "ORDER BY seq DESC LIMIT 1", tuple(args)).fetchone()
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        return None if row is None else self._row(row)

    def _row(self, row: tuple) -> Event:
        return event_from_row(row, str(self.path))

    # -- artifacts (see ratchet.ledger.artifacts) -------------------------------------------------
    def put_artifact(self, data: bytes) -> str:
        """Store ``data`` (idempotent) and return its SHA-256 hex digest.

        Raises:
            LedgerError: too large, the ledger is read-only, or the write failed.
        """
        check_size(data)
        name = digest(bytes(data))
        try:
            self._db.execute(_ARTIFACT_SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO artifacts(hash, size, data) VALUES (?, ?, ?)",
                             (name, len(data), bytes(data)))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot store an artifact in ledger {self.path}: {exc}") from None
        return name

    def get_artifact(self, name: str) -> bytes:
        """The bytes stored under digest ``name``.

        Raises:
            LedgerError: no such artifact, or it is damaged.
        """
        try:
            with self._bounded():
                row = self._db.execute("SELECT data FROM artifacts WHERE hash = ?", (name,)).fetchone()
        except sqlite3.OperationalError:  # no artifacts table: nothing was ever stored
            row = None
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        return check_artifact(name, None if row is None else bytes(row[0]), str(self.path))

    # -- writer lease (see ratchet.ledger.lease; times are this machine's clock: a SQLite file is local) --
    def acquire_lease(self, holder: LeaseHolder, ttl_s: float, *, take_over: str | None = None) -> LeaseInfo:
        """Take the writer lease unless another holder's is live (atomic: one ``BEGIN IMMEDIATE``
        transaction). Once taken, this instance's appends are fenced on it.

        Args:
            holder: Who asks.
            ttl_s: Seconds the lease lives without a heartbeat.
            take_over: Also take it from the holder with this token (a dead process on this host).

        Returns:
            The lease as stored afterwards: ours iff ``info.holder.token == holder.token``.

        Raises:
            LedgerError: read-only or failed write.
        """
        now = time.time()
        try:
            with self._transaction():
                self._db.execute(_LEASE_SCHEMA)
                cur = self._db.execute(
                    "UPDATE lease SET token = ?, host = ?, pid = ?, heartbeat_at = ?, expires_at = ?, released = 0 "
                    "WHERE expires_at <= ? OR released OR token IN (?, ?)",
                    (holder.token, holder.host, holder.pid, now, now + ttl_s, now, holder.token, take_over or ""))
                if cur.rowcount == 0:
                    self._db.execute("INSERT OR IGNORE INTO lease(id, token, host, pid, heartbeat_at, expires_at) "
                                     "VALUES (1, ?, ?, ?, ?, ?)",
                                     (holder.token, holder.host, holder.pid, now, now + ttl_s))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot take the writer lease of ledger {self.path}: {exc}") from None
        info = self.read_lease()
        assert info is not None
        if info.holder.token == holder.token:
            self._fence, self._lease_lost = holder.token, False
        return info

    def renew_lease(self, holder: LeaseHolder, ttl_s: float) -> bool:
        """Heartbeat: push the expiry to now + ``ttl_s`` seconds. Safe from another thread (own connection).

        Returns:
            False when another holder took the lease (this instance's appends then raise).

        Raises:
            LedgerError: the write failed.
        """
        now = time.time()
        try:
            con = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            try:
                cur = con.execute("UPDATE lease SET heartbeat_at = ?, expires_at = ? WHERE token = ? AND NOT released",
                                  (now, now + ttl_s, holder.token))
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot renew the writer lease of ledger {self.path}: {exc}") from None
        if cur.rowcount == 0:
            self._lease_lost = True
        return not self._lease_lost

    def release_lease(self, holder: LeaseHolder) -> None:
        """Give the lease up (if still ours); appends are no longer fenced.

        Raises:
            LedgerError: the write failed.
        """
        if self._fence == holder.token:
            self._fence = None
        now = time.time()
        try:
            self._db.execute("UPDATE lease SET released = 1, expires_at = ? WHERE token = ?", (now, holder.token))
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise LedgerError(f"cannot release the writer lease of ledger {self.path}: {exc}") from None

    def read_lease(self) -> LeaseInfo | None:
        """The run's writer lease, or None when no writer ever took one (or the ledger predates leases).

        Raises:
            LedgerError: the file is damaged.
        """
        from ratchet.ledger.lease import LeaseHolder, LeaseInfo

        try:
            with self._bounded():
                row = self._db.execute("SELECT token, host, pid, heartbeat_at, expires_at, released FROM lease").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path} is damaged: {exc}") from None
        if row is None:
            return None
        return LeaseInfo(LeaseHolder(row[0], row[1], int(row[2])), float(row[3]), float(row[4]), time.time(),
                         bool(row[5]))

    def _lost_error(self, key: str) -> WriterLeaseError:
        info = self.read_lease()
        who = f" (pid {info.holder.pid} on host {info.holder.host})" if info is not None else ""
        return WriterLeaseError(f"lost the writer lease of ledger {self.path}: another process{who} took the run over "
                                f"after this one missed its heartbeats; not appending {key!r} (this process stops "
                                "writing so that two writers never interleave one ledger)")

    def close(self) -> None:
        """Close the connection."""
        self._db.close()
