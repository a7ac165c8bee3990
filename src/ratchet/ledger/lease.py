"""Writer leases: at most one process appends to a run at a time, on any number of machines.

A run's *writer lease* is one row in the ledger's own store (a ``lease`` table in a run's SQLite file;
the ``ratchet_leases`` table, keyed by run id, in a shared database), so every machine that can reach
the ledger sees it. It names its holder (a random token, the host name and the pid) and carries a
heartbeat time and an expiry time, both on the **store's clock** (PostgreSQL's
``statement_timestamp()``; a SQLite file is local, so its machine's clock), so writers on machines whose
clocks disagree still agree on who holds it.

- **Acquire** is an atomic compare-and-set in the store: take the row if it is absent, expired,
  released, or already ours; otherwise the store reports who holds it.
- **Heartbeat**: the writer renews the lease every ``ttl/3`` seconds on a background thread. A writer
  that dies (``kill -9``, a lost machine) stops renewing; ``ttl`` seconds after its last heartbeat any
  machine may take the run over. On the same host a dead pid is noticed at once (no need to wait).
- **Fencing**: while a store holds a lease, each append is one statement that inserts only if the lease
  row still carries this writer's token (PostgreSQL locks that row ``FOR SHARE`` for the statement, so
  a take-over waits for, or excludes, an append in flight). A writer that stalled past its expiry and
  was taken over therefore cannot interleave a single event: its next append raises
  :class:`~ratchet.errors.WriterLeaseError`.

Why a row and not a PostgreSQL advisory lock: a session advisory lock would need one connection held
for the whole run (and breaks behind a transaction-mode pooler), it is released only when the server
notices the dead connection (TCP keepalive: up to hours for a machine that vanished), it cannot say
*who* holds it or *when it was last seen* (``ratchet show`` needs both), and SQLite stores would still
need another mechanism. The row works the same in every store; the fence gives the exclusion that
an advisory lock would.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from ratchet.errors import LedgerError, WriterLeaseError
from ratchet.processes import process_running

__all__ = [
    "DEFAULT_TTL_S",
    "TTL_ENV",
    "LeaseHolder",
    "LeaseInfo",
    "WriterLease",
    "format_age",
    "lease_ttl_s",
    "writer_dead_here",
]

#: Seconds a lease lives after its last heartbeat (the writer renews every third of it).
DEFAULT_TTL_S = 60.0
#: Environment variable that overrides :data:`DEFAULT_TTL_S` (seconds, > 0; short values are for tests).
TTL_ENV = "RATCHET_LEASE_TTL_S"


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds (or asks for) a lease.

    Attributes:
        token: Random id of this holder; the store compares tokens, never hosts or pids.
        host: ``socket.gethostname()`` of the holder (for messages and the same-host liveness check).
        pid: The holder's process id on ``host``.
    """

    token: str
    host: str
    pid: int

    @classmethod
    def this_process(cls) -> LeaseHolder:
        """A new holder for this process (a fresh token each call)."""
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid())


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as the store holds it, read at store time ``now``.

    Attributes:
        holder: The process that holds (or last held) it.
        heartbeat_at: Store time of its last heartbeat (Unix seconds).
        expires_at: Store time after which another process may take it (Unix seconds).
        now: Store time when this was read (Unix seconds).
        released: The holder gave it up (its run stopped without a ``kill -9``).
    """

    holder: LeaseHolder
    heartbeat_at: float
    expires_at: float
    now: float
    released: bool = False

    @property
    def expired(self) -> bool:
        """Whether another process may take it now (expired or released)."""
        return self.released or self.now >= self.expires_at

    @property
    def heartbeat_age_s(self) -> float:
        """Seconds since the last heartbeat (store clock)."""
        return max(0.0, self.now - self.heartbeat_at)

    @property
    def expires_in_s(self) -> float:
        """Seconds until it expires (0 when expired)."""
        return 0.0 if self.released else max(0.0, self.expires_at - self.now)

    def to_json(self) -> dict[str, Any]:
        """The lease as ``ratchet show --json`` prints it."""
        return {"host": self.holder.host, "pid": self.holder.pid,
                "last_heartbeat_s_ago": round(self.heartbeat_age_s, 1),
                "expires_in_s": round(self.expires_in_s, 1), "released": self.released}


def lease_ttl_s(ttl_s: float | None = None) -> float:
    """The lease time-to-live: ``ttl_s``, else ``$RATCHET_LEASE_TTL_S``, else :data:`DEFAULT_TTL_S`.

    Returns:
        Seconds (> 0).

    Raises:
        LedgerError: the value is not a positive number of seconds.
    """
    raw: Any = ttl_s if ttl_s is not None else os.environ.get(TTL_ENV) or DEFAULT_TTL_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or value == float("inf"):
        where = f"${TTL_ENV}" if ttl_s is None else "lease ttl_s"
        raise LedgerError(f"{where} must be a positive number of seconds, got {raw!r}")
    return value


def format_age(seconds: float) -> str:
    """A duration for people: ``"12 s"``, ``"3 min"``, ``"5 h"``, ``"2 days"``."""
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} days"


def writer_dead_here(info: LeaseInfo) -> bool:
    """Whether the lease's holder runs on this host and its process is gone (a fast signal that needs no
    expiry; a holder on another host can only be judged by its heartbeat)."""
    return info.holder.host == socket.gethostname() and not process_running(info.holder.pid)


class WriterLease:
    """This process's writer lease on one run's ledger, kept alive by a heartbeat thread.

    Use :meth:`acquire`; call :meth:`release` when the run stops (a ``kill -9`` skips it, and the lease
    then expires ``ttl_s`` seconds after the last heartbeat). While held, the store fences every append
    on it (see the module docstring).

    Attributes:
        store: The ledger store the lease lives in.
        holder: This process's :class:`LeaseHolder`.
        ttl_s: Seconds the lease lives after each heartbeat; heartbeats come every ``ttl_s / 3``.
    """

    def __init__(self, store: Any, holder: LeaseHolder, ttl_s: float) -> None:
        self.store, self.holder, self.ttl_s = store, holder, ttl_s
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ratchet-lease-heartbeat", daemon=True)

    @classmethod
    def acquire(cls, store: Any, run_id: str, ttl_s: float | None = None) -> WriterLease:
        """Take the run's writer lease and start its heartbeat.

        A lease held by a dead process on this host is taken over at once; one held elsewhere only
        after it expired (no heartbeat for its ``ttl_s``).

        Args:
            store: The run's ledger store (see :class:`ratchet.ledger.LedgerStore`).
            run_id: The run (for messages).
            ttl_s: Lease time-to-live in seconds (default: :func:`lease_ttl_s`).

        Raises:
            WriterLeaseError: another live process holds the lease.
            LedgerError: the store is read-only or failed.
        """
        ttl = lease_ttl_s(ttl_s)
        holder = LeaseHolder.this_process()
        info = store.acquire_lease(holder, ttl)
        if info.holder.token != holder.token and writer_dead_here(info):
            info = store.acquire_lease(holder, ttl, take_over=info.holder.token)
        if info.holder.token != holder.token:
            h = info.holder
            raise WriterLeaseError(
                f"run {run_id} is being written by pid {h.pid} on host {h.host} (last heartbeat "
                f"{format_age(info.heartbeat_age_s)} ago); wait for it to end or stop it (two writers would "
                f"interleave one ledger); if it died, its lease expires in {format_age(info.expires_in_s)} and "
                "the run can then be resumed from any machine")
        lease = cls(store, holder, ttl)
        lease._thread.start()
        return lease

    @property
    def lost(self) -> bool:
        """Whether a heartbeat found the lease taken over by another process."""
        return self._lost.is_set()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                held = self.store.renew_lease(self.holder, self.ttl_s)
            except LedgerError:  # the store is unreachable for now: retry; the fence guards the appends
                continue
            if not held:
                self._lost.set()
                return

    def release(self) -> None:
        """Stop the heartbeat and give the lease up (another process may take it at once). Never raises:
        an unreachable store leaves the lease to expire on its own."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self.store.release_lease(self.holder)
        except Exception:  # noqa: BLE001, S110 - releasing is best effort; expiry is the fallback
            pass
