"""Finding, opening and locking runs: run directories, their ledgers (SQLite file or a pointer to a database),
the directory lock and the writer lease. Below the loop: reading a run (``show``, ``export``, data sets)
needs none of the loop's machinery."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ratchet.errors import LedgerError, RunNotFoundError
from ratchet.execution.sandbox import hide_from_policies
from ratchet.ledger import Event, LedgerStore
from ratchet.ledger.lease import WriterLease
from ratchet.ledger.storage import LEDGER_FILE, followed_url, is_run_id, open_store, read_pointer, storage_url

__all__ = ["lock_run_dir", "new_run_id", "open_for_writing", "open_ledger", "open_run", "started_event"]


def new_run_id(name: str) -> str:
    """``<name>-<UTC yyyymmdd-HHMMSS>-<4 hex>``."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.urandom(2).hex()}"


def lock_run_dir(run_dir: Path) -> int:
    """Take the run directory's writer lock (``flock`` on ``RUN_DIR/.lock``) for this process's lifetime
    or until the returned descriptor is closed; the kernel drops it if the process dies.

    This guards the run directory's own files (``policy.py``, the report) on one machine; the ledger is
    guarded across machines by the run's writer lease (:class:`~ratchet.ledger.lease.WriterLease`).

    Raises:
        LedgerError: another process on this machine is writing this run, or the run directory cannot be written
            (read-only, another user's).
    """
    try:  # the ledger, report and policies of runs are not for policy code to read (see docs/concepts/trust.md)
        os.chmod(run_dir, 0o700)
    except OSError:
        pass
    hide_from_policies(run_dir.parent, run_dir)
    try:
        fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:  # a read-only folder, another user's run: nothing can be written, so nothing is lost
        raise LedgerError(f"cannot write run {run_dir.name}: {exc.strerror or exc} ({run_dir}); a run is resumed "
                          "where its folder can be written") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise LedgerError(f"run {run_dir.name} is being written by another ratchet process on this machine; "
                          "wait for it or stop it (two writers would interleave one ledger)") from None
    return fd


def open_run(run: str | Path, runs_dir: str | Path = "runs", *, storage: str | None = None,
             readonly: bool = False) -> tuple[LedgerStore, Path]:
    """Find an existing run and open its ledger.

    A run directory (``run`` itself, or ``runs_dir/run``) holds either ``ledger.sqlite`` or a
    ``ledger.json`` pointer to a database; a pointer is followed only when ``storage`` names the same
    database (then ``storage`` is what is connected to, with its password or libpq's
    ``PGPASSWORD``/``~/.pgpass``; see :func:`ratchet.ledger.storage.followed_url`). A run with no directory
    here is looked up by id (the last path component of ``run``) in the ``storage`` database.

    Args:
        run: Run id or run directory.
        runs_dir: Folder that holds run directories.
        storage: Database URL to look the run up in, or None.
        readonly: Open the ledger read-only.

    Returns:
        ``(ledger, run_dir)``; ``run_dir`` does not exist when the run was found only in ``storage``.

    Raises:
        RunNotFoundError: no such run.
        StorageNotNamedError: the run directory points to a database ``storage`` does not name (not opened).
        LedgerError: the ledger is damaged, the storage URL is bad or the database is unreachable.
    """
    for cand in (Path(run), Path(runs_dir) / str(run)):
        if (cand / LEDGER_FILE).is_file():
            return open_store(None, cand, cand.name, create=False, readonly=readonly), cand
        pointer = read_pointer(cand) if cand.is_dir() else None
        if pointer is not None:
            url = followed_url(pointer, storage, cand.name)
            return open_store(url, cand, pointer.run_id, create=False, readonly=readonly), cand
    if storage_url(storage) is not None:
        run_id = Path(run).name
        return open_store(storage, Path(runs_dir) / run_id, run_id, create=False, readonly=readonly), \
            Path(runs_dir) / run_id
    raise RunNotFoundError(f"no run {str(run)!r} (looked in {run} and {Path(runs_dir) / str(run)}); "
                           "`ratchet runs` lists the runs (add --storage URL for runs kept in a database)")


def open_ledger(run: str | Path, runs_dir: str | Path = "runs", *, readonly: bool = False,
                storage: str | None = None) -> LedgerStore:
    """Open an existing run's ledger, given a run directory or a run id (see :func:`open_run`).

    Raises:
        RunNotFoundError: no such run.
        LedgerError: the ledger is damaged or its database unreachable.
    """
    return open_run(run, runs_dir, storage=storage, readonly=readonly)[0]


def open_for_writing(run: str | Path, runs_dir: str | Path = "runs", *,
                     storage: str | None = None) -> tuple[LedgerStore, Path, int | None, WriterLease]:
    """Open an existing run to append to it, as its only writer: its directory lock (when it has a directory
    here; see :func:`lock_run_dir`) and then its writer lease (:class:`~ratchet.ledger.lease.WriterLease`),
    taken before its state is read, so no other process appends meanwhile (appends are fenced).

    Returns:
        ``(ledger, run_dir, lock_fd, lease)``; ``lock_fd`` is None when the run has no directory here yet.
        The caller releases the lease, closes the ledger and closes ``lock_fd``.

    Raises:
        RunNotFoundError: no such run.
        LedgerError: another process on this machine writes the run, or its ledger has no start event.
        WriterLeaseError: another live process writes the run (here or on another machine).
    """
    ledger, run_dir = open_run(run, runs_dir, storage=storage)
    lock_fd = None
    try:
        if run_dir.is_dir():  # before reading its state: a second writer on this machine stops here
            lock_fd = lock_run_dir(run_dir)
        lease = WriterLease.acquire(ledger, started_event(ledger).payload["run_id"])
    except BaseException:
        ledger.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    return ledger, run_dir, lock_fd, lease


def started_event(ledger: LedgerStore) -> Event:
    """The run's ``run_started`` event, its ``run_id`` checked (:func:`~ratchet.ledger.storage.is_run_id`): every
    path made of a recorded run id (``export --tensorboard DIR``'s ``DIR/RUN_ID``, a resumed run's TensorBoard folder)
    takes it from here.

    Raises:
        LedgerError: the ledger has none (it is not a run's, or its first append was lost), or its run id is not a
            plain name (``../../x``, an absolute path, a number: a damaged or hostile ledger).
    """
    started = ledger.get("run_started")
    if started is None:
        raise LedgerError(f"{ledger.location} has no run_started event; it cannot be resumed or corrected")
    run_id = started.payload.get("run_id") if isinstance(started.payload, dict) else None
    if not is_run_id(run_id):
        raise LedgerError(f"ledger {ledger.location} is damaged at event {started.seq}: its run id "
                          f"{str(run_id)[:60]!r} is not a plain name (letters, digits, '.', '_', '-'; no '/' or '..')")
    return started
