"""SQL ledger store: many runs in one database (PostgreSQL, or SQLite) through SQLAlchemy.

All runs share one table, ``ratchet_events``; a run's events are the rows with its ``run_id``, numbered
``seq`` = 1, 2, … without gaps. Every operation is one autocommitted statement. An append computes
its ``seq`` as the run's largest ``seq`` + 1 inside the ``INSERT`` and retries when a concurrent
writer took that number first (the primary key ``(run_id, seq)`` rejects the second insert), so
writers to one run serialize and commit in ``seq`` order: a reader that asks for ``seq > last``
never skips an event that commits later with a smaller number.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from sqlalchemy import (BigInteger, Column, Double, Engine, MetaData, PrimaryKeyConstraint, String, Table, Text,
                        UniqueConstraint, create_engine, event, func, insert, inspect, select)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url

from ratchet.errors import LedgerError, RunNotFoundError
from ratchet.ledger.events import Event, EventType

__all__ = ["SQLAlchemyLedger", "list_runs", "database_url", "display_url", "TABLE"]

#: Name of the table that holds every run's events.
TABLE = "ratchet_events"

_metadata = MetaData()
_events = Table(
    TABLE, _metadata,
    Column("run_id", String(200), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("key", Text, nullable=False),
    Column("type", String(64), nullable=False),
    Column("time", Double, nullable=False),
    Column("payload", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "seq", name=f"{TABLE}_pkey"),
    UniqueConstraint("run_id", "key", name=f"{TABLE}_run_key"),
)
_COLUMNS = (_events.c.seq, _events.c.type, _events.c.key, _events.c.time, _events.c.payload)
_EXPECTED = "expected postgresql://USER@HOST[:PORT]/DATABASE or sqlite:///PATH"
_APPEND_DEADLINE_S = 60.0


_SECRET_QUERY_KEYS = {"password", "sslpassword", "passfile"}


def _mask(raw: str) -> str:
    """``raw`` with any password (between ``user:`` and the last ``@``, or as a query value) replaced by ``***``."""
    raw = re.sub(r"(://[^:/@]*:).*@", r"\1***@", raw)
    return re.sub(r"((?:ssl)?password=)[^&]*", r"\1***", raw, flags=re.I)


def database_url(storage: str) -> URL:
    """Parse and normalise a storage URL.

    ``postgresql://`` and ``postgres://`` select psycopg 3 (``postgresql+psycopg://``); a relative
    SQLite path becomes absolute, so the URL means the same file from any working directory.

    Args:
        storage: A SQLAlchemy database URL, e.g. ``postgresql://ratchet@db.example/ratchet``.

    Returns:
        The normalised :class:`sqlalchemy.engine.URL`.

    Raises:
        LedgerError: ``storage`` is not a database URL.
    """
    netloc = storage.split("://", 1)[-1].split("/", 1)[0]
    if netloc.count("@") > 1:
        raise LedgerError(f"storage {_mask(storage)!r} has more than one '@' before the host; write an '@' in the "
                          "password as %40")
    try:
        url = make_url(storage)
    except (sa_exc.ArgumentError, ValueError) as exc:
        detail = "" if isinstance(exc, sa_exc.ArgumentError) else f" ({exc})"
        raise LedgerError(f"storage {_mask(storage)!r} is not a database URL{detail}; {_EXPECTED}") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "sqlite":
        if url.database in (None, "", ":memory:") or "mode=memory" in str(url):
            raise LedgerError(f"storage {_mask(storage)!r} is an in-memory database: the ledger would vanish with "
                              "the process; give a file, sqlite:///PATH")
        if not url.database.startswith("file:"):
            url = url.set(database=str(Path(url.database).expanduser().resolve()))
    secret = [k for k in url.query if k.lower() in _SECRET_QUERY_KEYS]
    if secret:
        raise LedgerError(f"storage URL carries a password in its query ({', '.join(secret)}=…), where ratchet "
                          "would store and print it; put it in PGPASSWORD or ~/.pgpass, or as USER:PASSWORD@HOST")
    return url


def display_url(url: str | URL, *, password: bool = False) -> str:
    """A URL safe to print or store: its password masked as ``***`` or left out.

    Args:
        url: A URL string or object (strings are normalised with :func:`database_url`).
        password: ``True`` keeps a ``***`` placeholder where the password was; ``False`` drops it,
            which gives a URL that still connects when the password comes from ``PGPASSWORD`` or
            ``~/.pgpass``.
    """
    u = database_url(url) if isinstance(url, str) else url
    if password:
        return u.render_as_string(hide_password=True)
    return URL.create(u.drivername, u.username, None, u.host, u.port, u.database, u.query).render_as_string(
        hide_password=False)


def _reason(exc: BaseException) -> str:
    """The driver's message of a database error, on one line (never SQLAlchemy's statement dump)."""
    orig = getattr(exc, "orig", None) or exc
    text = " ".join(str(orig).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def _engine(url: URL, readonly: bool) -> Engine:
    """An autocommit engine for ``url``.

    Raises:
        LedgerError: unknown database kind or its driver is not installed.
    """
    backend = url.get_backend_name()
    connect_args: dict[str, Any] = {}
    if backend == "postgresql":
        defaults = {"application_name": "ratchet", "connect_timeout": 10}  # a URL's own settings win
        connect_args = {k: v for k, v in defaults.items() if k not in url.query}
        if readonly:
            opts = url.query.get("options", "")
            opts = " ".join(opts) if isinstance(opts, tuple) else opts
            connect_args["options"] = f"{opts} -c default_transaction_read_only=on".strip()
    elif backend == "sqlite":
        connect_args = {"timeout": 30}
    try:
        engine = create_engine(url, isolation_level="AUTOCOMMIT", connect_args=connect_args)
    except sa_exc.NoSuchModuleError:
        raise LedgerError(f"unknown database kind {url.drivername!r} in storage URL; {_EXPECTED}") from None
    except ImportError as exc:
        raise LedgerError(f"the database driver for {url.drivername} is not installed ({exc}); install it, or "
                          "use postgresql://… (its driver, psycopg 3, comes with ratchet)") from None
    if backend == "sqlite":
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # durable appends, readers never block the writer
            cur = dbapi_conn.cursor()
            if readonly:
                cur.execute("PRAGMA query_only = ON")
            else:
                cur.execute("PRAGMA journal_mode = WAL")
                cur.execute("PRAGMA synchronous = FULL")
            cur.close()
    return engine


class SQLAlchemyLedger:
    """Append-only event log of one run in a shared SQL database (PostgreSQL or SQLite).

    Several processes may append to and read from one database at once: different runs never
    interfere, and writers to the same run get consecutive ``seq`` numbers in commit order. Each
    append is durable when :meth:`append` returns. Open one instance per process (connections are
    not shared across ``fork``).

    Args:
        url: SQLAlchemy database URL: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE`` (psycopg 3;
            libpq's ``PGPASSWORD``/``~/.pgpass`` supply a password left out of the URL) or
            ``sqlite:///PATH``. Other SQLAlchemy dialects work if their driver is installed.
        run_id: The run whose events this ledger reads and appends (at most 200 characters).
        create: Create the events table if it is missing; with False the run must already have events.
        readonly: Refuse appends (and open the database read-only); the run must already have events.

    Attributes:
        run_id: The run.
        url: The normalised URL (password included; never print it, use ``location``).
        location: Where the ledger is, for messages: the run id and the URL with its password masked.

    Raises:
        LedgerError: bad URL, missing driver, unreachable database, or not a ratchet ledger table.
        RunNotFoundError: ``create=False`` or ``readonly`` and the run has no events in the database.
    """

    def __init__(self, url: str, run_id: str, *, create: bool = True, readonly: bool = False) -> None:
        self.url = database_url(url)
        self.run_id = run_id
        self.readonly = readonly
        shown = display_url(self.url, password=True)
        self.location = f"run {run_id} in {shown}"
        if not run_id or len(run_id) > 200:
            raise LedgerError(f"run id must be 1 to 200 characters, got {len(run_id)}")
        db = self.url.database
        if self.url.get_backend_name() == "sqlite" and db and db != ":memory:" and not db.startswith("file:"):
            if (readonly or not create) and not Path(db).is_file():
                raise LedgerError(f"no ledger database at {db}")
            if create and not readonly:
                Path(db).parent.mkdir(parents=True, exist_ok=True)
        self._engine = _engine(self.url, readonly)
        try:
            with self._engine.connect() as conn:
                has_table = inspect(conn).has_table(TABLE)
                if not has_table and create and not readonly:
                    _create_table(self._engine)
                    has_table = True
                if has_table:
                    conn.execute(select(*_COLUMNS).limit(1)).fetchall()  # the columns we need exist
                exists = has_table and conn.execute(
                    select(_events.c.seq).where(_events.c.run_id == run_id).limit(1)).first() is not None
        except sa_exc.DBAPIError as exc:
            self._engine.dispose()
            raise LedgerError(_connect_error(shown, exc)) from None
        if (readonly or not create) and not exists:
            self._engine.dispose()
            raise RunNotFoundError(f"no run {run_id!r} in {shown}; `ratchet runs --storage URL` lists its runs")

    def append(self, type: EventType, key: str, payload: dict[str, Any]) -> tuple[Event, bool]:
        """Append one event unless this run already has ``key``.

        Args:
            type: The event type.
            key: Identity of the event within the run; appending it again changes nothing.
            payload: JSON-ready data (NaN and infinities allowed).

        Returns:
            ``(event, created)``: the stored event and whether this call created it.

        Raises:
            LedgerError: the ledger is read-only, or the database failed or stayed contended for 60 s.
        """
        if self.readonly:
            raise LedgerError(f"ledger {self.location} is open read-only; cannot append {key!r}")
        body = json.dumps(payload, separators=(",", ":"))
        next_seq = (select(func.coalesce(func.max(_events.c.seq), 0) + 1)
                    .where(_events.c.run_id == self.run_id).scalar_subquery())
        deadline = time.monotonic() + _APPEND_DEADLINE_S
        while True:
            now = time.time()
            stmt = insert(_events).values(run_id=self.run_id, seq=next_seq, key=key, type=type.value, time=now,
                                          payload=body).returning(_events.c.seq)
            try:
                with self._engine.connect() as conn:
                    seq = conn.execute(stmt).scalar_one()
                return Event(int(seq), type, key, now, payload), True
            except sa_exc.IntegrityError:
                stored = self.get(key)
                if stored is not None:  # the key exists (recorded earlier, or another writer won the race)
                    return stored, False
                # another writer took this seq first: compute the next one and try again
            except sa_exc.OperationalError as exc:  # deadlock / serialization failure / busy: retry
                if getattr(getattr(exc, "orig", None), "sqlstate", None) not in ("40001", "40P01"):
                    raise LedgerError(f"cannot append to ledger {self.location}: {_reason(exc)}") from None
            except sa_exc.DBAPIError as exc:
                raise LedgerError(f"cannot append to ledger {self.location}: {_reason(exc)}") from None
            if time.monotonic() > deadline:
                raise LedgerError(f"cannot append {key!r} to ledger {self.location}: still contended after "
                                  f"{_APPEND_DEADLINE_S:.0f} s")

    def get(self, key: str) -> Event | None:
        """The event with this key in this run, or None.

        Raises:
            LedgerError: the database failed or the row is damaged.
        """
        rows = self._select(select(*_COLUMNS).where(_events.c.run_id == self.run_id, _events.c.key == key))
        return self._row(rows[0]) if rows else None

    def read(self, from_seq: int = 0) -> list[Event]:
        """This run's events with ``seq > from_seq``, in order (a gap-free prefix of the run even
        while other processes append).

        Raises:
            LedgerError: the database failed or a row is damaged (bad JSON, unknown event type).
        """
        return [self._row(r) for r in self._select(
            select(*_COLUMNS).where(_events.c.run_id == self.run_id, _events.c.seq > from_seq)
            .order_by(_events.c.seq))]

    def _select(self, stmt) -> list:
        try:
            with self._engine.connect() as conn:
                return conn.execute(stmt).fetchall()
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot read ledger {self.location}: {_reason(exc)}") from None

    def _row(self, row) -> Event:
        try:
            return Event(int(row[0]), EventType(row[1]), row[2], float(row[3]), json.loads(row[4]))
        except (ValueError, TypeError) as exc:
            raise LedgerError(f"ledger {self.location} is damaged at event {row[0]}: {exc}") from None

    def close(self) -> None:
        """Close this ledger's database connections."""
        self._engine.dispose()


def _create_table(engine: Engine) -> None:
    """Create the events table; a concurrent creator winning the race is fine."""
    try:
        _metadata.create_all(engine, checkfirst=True)
    except sa_exc.DBAPIError:
        with engine.connect() as conn:
            if not inspect(conn).has_table(TABLE):
                raise


def _connect_error(shown: str, exc: sa_exc.DBAPIError) -> str:
    reason = _reason(exc)
    hint = ""
    if "password" in reason.lower():
        hint = "; set PGPASSWORD (or ~/.pgpass), or put the password in the --storage URL"
    elif isinstance(exc, sa_exc.OperationalError) and "server running" not in reason:
        hint = "; is the database server running and the URL right?"
    return f"cannot open ledger database {shown}: {reason}{hint}"


def list_runs(url: str) -> list[tuple[str, float]]:
    """The runs recorded in a database.

    Args:
        url: Database URL, as for :class:`SQLAlchemyLedger`.

    Returns:
        ``(run_id, started)`` pairs, oldest first; ``started`` is the Unix time (seconds) of the run's
        first event (its ``run_started``). An empty database (no events table yet) has no runs.

    Raises:
        LedgerError: bad URL, missing driver or unreachable database.
    """
    u = database_url(url)
    shown = display_url(u, password=True)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:" \
            and not u.database.startswith("file:") and not Path(u.database).is_file():
        raise LedgerError(f"no ledger database at {u.database}")
    engine = _engine(u, readonly=True)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(TABLE):
                return []
            started = func.min(_events.c.time)
            rows = conn.execute(select(_events.c.run_id, started).group_by(_events.c.run_id)
                                .order_by(started, _events.c.run_id)).fetchall()
    except sa_exc.DBAPIError as exc:
        raise LedgerError(_connect_error(shown, exc)) from None
    finally:
        engine.dispose()
    return [(r[0], float(r[1])) for r in rows]
