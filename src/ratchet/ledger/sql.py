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
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Engine,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    cast,
    create_engine,
    event,
    exists,
    extract,
    func,
    insert,
    inspect,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url

from ratchet.errors import LedgerError, RunNotFoundError, WriterLeaseError
from ratchet.ledger.artifacts import check_artifact, check_size, digest
from ratchet.ledger.events import Event, EventType, event_from_row

if TYPE_CHECKING:
    from ratchet.ledger.lease import LeaseHolder, LeaseInfo

__all__ = ["ARTIFACTS_TABLE", "LEASES_TABLE", "TABLE", "SQLAlchemyLedger", "database_url", "display_url", "list_runs",
           "shared_engine"]

#: Name of the table that holds every run's events.
TABLE = "ratchet_events"
#: Name of the table that holds each run's writer lease (see :mod:`ratchet.ledger.lease`).
LEASES_TABLE = "ratchet_leases"
#: Name of the table that holds content-addressed artifacts, shared by all runs (see :mod:`ratchet.ledger.artifacts`).
ARTIFACTS_TABLE = "ratchet_artifacts"

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
_leases = Table(
    LEASES_TABLE, _metadata,
    Column("run_id", String(200), primary_key=True),
    Column("token", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", BigInteger, nullable=False),
    Column("heartbeat_at", Double, nullable=False),  # store clock, Unix seconds
    Column("expires_at", Double, nullable=False),
    Column("released", Boolean, nullable=False),
)
_artifacts = Table(
    ARTIFACTS_TABLE, _metadata,
    Column("hash", String(64), primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),
)
_COLUMNS = (_events.c.seq, _events.c.type, _events.c.key, _events.c.time, _events.c.payload)
_EXPECTED = "expected postgresql://USER@HOST[:PORT]/DATABASE or sqlite:///PATH"
_APPEND_DEADLINE_S = 60.0


_SECRET_QUERY_KEYS = {"password", "sslpassword", "passfile"}


def _mask(raw: str) -> str:
    """``raw`` with any password (between ``user:`` and the last ``@``, or as a query value) replaced by ``***``."""
    raw = re.sub(r"(://[^:/@]*:).*@", r"\1***@", raw)
    return re.sub(r"((?:ssl)?password=)[^&]*", r"\1***", raw, flags=re.IGNORECASE)


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
    if "\0" in storage or "%00" in storage:  # a NUL (also %-encoded) names no file or host anywhere
        raise LedgerError(f"storage {_mask(storage)!r} contains a NUL character; remove it")
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
        engine: An engine made by :func:`shared_engine` for this URL, shared by many ledgers (a reader of many
            runs, such as ``ratchet dashboard``, keeps one connection pool); :meth:`close` then leaves it open.

    Attributes:
        run_id: The run.
        url: The normalised URL (password included; never print it, use ``location``).
        location: Where the ledger is, for messages: the run id and the URL with its password masked.

    Raises:
        LedgerError: bad URL, missing driver, unreachable database, or not a ratchet ledger table.
        RunNotFoundError: ``create=False`` or ``readonly`` and the run has no events in the database.
    """

    def __init__(self, url: str, run_id: str, *, create: bool = True, readonly: bool = False,
                 engine: Engine | None = None) -> None:
        self.url = database_url(url)
        self.run_id = run_id
        self.readonly = readonly
        shown = display_url(self.url, password=True)
        self.location = f"run {run_id} in {shown}"
        self._fence: str | None = None  # the token of the lease this instance holds: appends are fenced on it
        self._lease_lost = False
        self._has_leases = False
        if not run_id or len(run_id) > 200:
            raise LedgerError(f"run id must be 1 to 200 characters, got {len(run_id)}")
        db = self.url.database
        if self.url.get_backend_name() == "sqlite" and db and db != ":memory:" and not db.startswith("file:"):
            if (readonly or not create) and not Path(db).is_file():
                raise LedgerError(f"no ledger database at {db}")
            if create and not readonly:
                Path(db).parent.mkdir(parents=True, exist_ok=True)
        self._owns_engine = engine is None
        self._engine = _engine(self.url, readonly) if engine is None else engine
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
            self.close()
            raise LedgerError(_connect_error(shown, exc)) from None
        if (readonly or not create) and not exists:
            self.close()
            raise RunNotFoundError(f"no run {run_id!r} in {shown}; `ratchet runs --storage URL` lists its runs")

    def append_many(self, events: Sequence[tuple[EventType, str, dict[str, Any]]]) -> list[tuple[Event, bool]]:
        """:meth:`append` each of ``events`` in order (each commits on its own: a database server's commit is cheap
        next to a file's ``fsync``, and a store shared by many runs keeps its write transactions short)."""
        return [self.append(type, key, payload) for type, key, payload in events]

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
        if self._lease_lost:
            raise self._lost_error(key)
        body = json.dumps(payload, separators=(",", ":"))
        next_seq = (select(func.coalesce(func.max(_events.c.seq), 0) + 1)
                    .where(_events.c.run_id == self.run_id).scalar_subquery())
        deadline = time.monotonic() + _APPEND_DEADLINE_S
        while True:
            now = time.time()
            if self._fence is None:
                stmt = insert(_events).values(run_id=self.run_id, seq=next_seq, key=key, type=type.value, time=now,
                                              payload=body).returning(_events.c.seq)
            else:  # insert only while our lease row holds our token (locked FOR SHARE on PostgreSQL)
                held = select(_leases.c.run_id).where(_leases.c.run_id == self.run_id, _leases.c.token == self._fence)
                if self._postgres:
                    held = held.with_for_update(read=True)
                row = select(literal(self.run_id, String), next_seq, literal(key, Text), literal(type.value, String),
                             literal(now, Double), literal(body, Text)).where(exists(held))
                stmt = insert(_events).from_select(["run_id", "seq", "key", "type", "time", "payload"], row) \
                    .returning(_events.c.seq)
            try:
                with self._engine.connect() as conn:
                    seq = conn.execute(stmt).scalar_one_or_none()
                if seq is None:
                    self._lease_lost = True
                    raise self._lost_error(key)
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

    def read(self, from_seq: int = 0, types: Collection[EventType] | None = None) -> list[Event]:
        """This run's events with ``seq > from_seq`` (of ``types``, when given), in order (a gap-free prefix of the
        run even while other processes append).

        Raises:
            LedgerError: the database failed or a row is damaged (bad JSON, unknown event type).
        """
        stmt = select(*_COLUMNS).where(_events.c.run_id == self.run_id, _events.c.seq > from_seq)
        if types is not None:
            stmt = stmt.where(_events.c.type.in_(sorted({EventType(t).value for t in types})))
        return [self._row(r) for r in self._select(stmt.order_by(_events.c.seq))]

    def tail(self, types: Collection[EventType] | None = None) -> Event | None:
        """This run's newest event (of ``types``, when given), or None.

        Raises:
            LedgerError: the database failed or the row is damaged.
        """
        stmt = select(*_COLUMNS).where(_events.c.run_id == self.run_id)
        if types is not None:
            stmt = stmt.where(_events.c.type.in_(sorted({EventType(t).value for t in types})))
        rows = self._select(stmt.order_by(_events.c.seq.desc()).limit(1))
        return self._row(rows[0]) if rows else None

    def _select(self, stmt) -> Sequence[Any]:
        try:
            with self._engine.connect() as conn:
                return conn.execute(stmt).fetchall()
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot read ledger {self.location}: {_reason(exc)}") from None

    def _row(self, row) -> Event:
        return event_from_row(tuple(row), self.location)

    # -- artifacts (see ratchet.ledger.artifacts; one table shared by every run) -------------------
    def put_artifact(self, data: bytes) -> str:
        """Store ``data`` (idempotent; identical bytes of other runs are shared) and return its SHA-256
        hex digest.

        Raises:
            LedgerError: too large, read-only, or the database failed.
        """
        if self.readonly:
            raise LedgerError(f"ledger {self.location} is open read-only; cannot store an artifact")
        check_size(data)
        name = digest(bytes(data))
        try:
            with self._engine.connect() as conn:
                if not inspect(conn).has_table(ARTIFACTS_TABLE):
                    _create_table(self._engine)
                if conn.execute(select(_artifacts.c.hash).where(_artifacts.c.hash == name)).first() is None:
                    try:
                        conn.execute(insert(_artifacts).values(hash=name, size=len(data), data=bytes(data)))
                        conn.commit()
                    except sa_exc.IntegrityError:  # another writer stored the same bytes first
                        conn.rollback()
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot store an artifact in {self.location}: {_reason(exc)}") from None
        return name

    def get_artifact(self, name: str) -> bytes:
        """The bytes stored under digest ``name``.

        Raises:
            LedgerError: no such artifact, it is damaged, or the database failed.
        """
        try:
            with self._engine.connect() as conn:
                if not inspect(conn).has_table(ARTIFACTS_TABLE):
                    row = None
                else:
                    row = conn.execute(select(_artifacts.c.data).where(_artifacts.c.hash == name)).first()
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot read ledger {self.location}: {_reason(exc)}") from None
        return check_artifact(name, None if row is None else bytes(row[0]), self.location)

    # -- writer lease (see ratchet.ledger.lease) ---------------------------------------------------
    @property
    def _postgres(self) -> bool:
        return self.url.get_backend_name() == "postgresql"

    def _now(self):
        """The store's clock (Unix seconds) as SQL: PostgreSQL's, so machines with skewed clocks agree on
        expiry; for SQLite (a local file) and other databases, this machine's."""
        if self._postgres:
            return cast(extract("epoch", func.statement_timestamp()), Double)
        return literal(time.time(), Double)

    def _lease_table(self, conn) -> bool:
        if not self._has_leases:
            self._has_leases = inspect(conn).has_table(LEASES_TABLE)
        return self._has_leases

    def acquire_lease(self, holder: LeaseHolder, ttl_s: float, *, take_over: str | None = None) -> LeaseInfo:
        """Take this run's writer lease unless another holder's is live.

        Atomic without a transaction: an ``UPDATE … WHERE expired OR released OR token IN (ours,
        take_over)`` (row-locked: of two concurrent takers the second re-checks the row the first wrote
        and matches nothing), else an ``INSERT`` that the primary key refuses if the row appeared
        meanwhile. Expiry is judged on the database's clock. Once taken, this instance's appends are fenced.

        Args:
            holder: Who asks.
            ttl_s: Seconds the lease lives without a heartbeat.
            take_over: Also take it from the holder with this token (a dead process on this host).

        Returns:
            The lease as stored afterwards: ours iff ``info.holder.token == holder.token``.

        Raises:
            LedgerError: read-only, no permission to create the lease table, or the database failed.
        """
        if self.readonly:
            raise LedgerError(f"ledger {self.location} is open read-only; cannot take its writer lease")
        c = _leases.c
        try:
            with self._engine.connect() as conn:
                if not self._lease_table(conn):
                    _create_table(self._engine)
                    self._has_leases = True
                now = self._now()
                mine = {"token": holder.token, "host": holder.host[:255], "pid": holder.pid, "heartbeat_at": now,
                        "expires_at": now + ttl_s, "released": False}
                took = conn.execute(update(_leases).where(
                    c.run_id == self.run_id,
                    or_(c.expires_at <= now, c.released.is_(True), c.token.in_([holder.token, take_over or ""])))
                    .values(**mine)).rowcount
                if not took:
                    try:
                        conn.execute(insert(_leases).values(run_id=self.run_id, **mine))
                    except sa_exc.IntegrityError:
                        pass  # another process inserted it first: read who
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot take the writer lease of {self.location}: {_reason(exc)}") from None
        info = self.read_lease()
        assert info is not None
        if info.holder.token == holder.token:
            self._fence, self._lease_lost = holder.token, False
        return info

    def renew_lease(self, holder: LeaseHolder, ttl_s: float) -> bool:
        """Heartbeat: push the expiry to the database's now + ``ttl_s`` seconds (thread-safe).

        Returns:
            False when another holder took the lease (this instance's appends then raise).

        Raises:
            LedgerError: the database failed.
        """
        c = _leases.c
        try:
            with self._engine.connect() as conn:
                now = self._now()
                n = conn.execute(update(_leases).where(c.run_id == self.run_id, c.token == holder.token,
                                                       c.released.is_(False))
                                 .values(heartbeat_at=now, expires_at=now + ttl_s)).rowcount
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot renew the writer lease of {self.location}: {_reason(exc)}") from None
        if n == 0:
            self._lease_lost = True
        return not self._lease_lost

    def release_lease(self, holder: LeaseHolder) -> None:
        """Give the lease up (if still ours); appends are no longer fenced.

        Raises:
            LedgerError: the database failed.
        """
        if self._fence == holder.token:
            self._fence = None
        c = _leases.c
        try:
            with self._engine.connect() as conn:
                if self._lease_table(conn):
                    conn.execute(update(_leases).where(c.run_id == self.run_id, c.token == holder.token)
                                 .values(released=True, expires_at=self._now()))
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot release the writer lease of {self.location}: {_reason(exc)}") from None

    def read_lease(self) -> LeaseInfo | None:
        """This run's writer lease, or None when no writer took one (or the database predates leases).

        Raises:
            LedgerError: the database failed.
        """
        from ratchet.ledger.lease import LeaseHolder, LeaseInfo

        c = _leases.c
        try:
            with self._engine.connect() as conn:
                if not self._lease_table(conn):
                    return None
                row = conn.execute(select(c.token, c.host, c.pid, c.heartbeat_at, c.expires_at, c.released,
                                          self._now()).where(c.run_id == self.run_id)).first()
        except sa_exc.DBAPIError as exc:
            raise LedgerError(f"cannot read the writer lease of {self.location}: {_reason(exc)}") from None
        if row is None:
            return None
        return LeaseInfo(LeaseHolder(row[0], row[1], int(row[2])), float(row[3]), float(row[4]), float(row[6]),
                         bool(row[5]))

    def _lost_error(self, key: str) -> WriterLeaseError:
        try:
            info = self.read_lease()
        except LedgerError:
            info = None
        who = f" (pid {info.holder.pid} on host {info.holder.host})" if info is not None else ""
        return WriterLeaseError(f"lost the writer lease of {self.location}: another process{who} took the run over "
                                f"after this one missed its heartbeats; not appending {key!r} (this process stops "
                                "writing so that two writers never interleave one ledger)")

    def close(self) -> None:
        """Close this ledger's database connections (a shared engine stays open: its maker disposes it)."""
        if self._owns_engine:
            self._engine.dispose()


def shared_engine(url: str, readonly: bool = True) -> Engine:
    """One engine (connection pool) for ``url`` that many :class:`SQLAlchemyLedger` instances may share
    (``engine=``); dispose it when done.

    Raises:
        LedgerError: bad URL, unknown database kind or its driver is not installed.
    """
    return _engine(database_url(url), readonly)


def _create_table(engine: Engine) -> None:
    """Create the events and leases tables; a concurrent creator winning the race is fine."""
    try:
        _metadata.create_all(engine, checkfirst=True)
    except sa_exc.DBAPIError:
        with engine.connect() as conn:
            if not all(inspect(conn).has_table(t) for t in (TABLE, LEASES_TABLE, ARTIFACTS_TABLE)):
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
