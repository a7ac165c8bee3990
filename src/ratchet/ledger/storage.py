"""Where a run's ledger lives: the one place that picks a store for a run.

By default each run directory holds its own SQLite file (``ledger.sqlite``). With a storage URL
(``--storage``), the run's events go to a shared database instead and the run directory holds a
pointer file (``ledger.json``: the URL without its password, and the run id), so commands given only
the run directory find the ledger again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ratchet.errors import LedgerError
from ratchet.ledger.sqlite import SQLiteLedger

if TYPE_CHECKING:
    from ratchet.ledger.sql import SQLAlchemyLedger

# ratchet.ledger.sql (SQLAlchemy) is imported only when a storage URL is used: worker processes and
# default runs never pay for it.

__all__ = [
    "LEDGER_FILE",
    "POINTER_FILE",
    "Pointer",
    "open_store",
    "read_pointer",
    "storage_url",
    "with_password_of",
    "write_pointer",
]

#: The per-run SQLite ledger in a run directory (the default store).
LEDGER_FILE = "ledger.sqlite"
#: The pointer to a run's ledger in a shared database, in a run directory.
POINTER_FILE = "ledger.json"


@dataclass(frozen=True)
class Pointer:
    """What a run directory's ``ledger.json`` says.

    Attributes:
        storage: Database URL without its password.
        run_id: The run's id in that database.
    """

    storage: str
    run_id: str


def storage_url(storage: str | None) -> str | None:
    """Check a ``--storage`` value.

    Args:
        storage: A database URL, or None / empty for the default (a SQLite file per run directory).

    Returns:
        The normalised URL (``postgresql+psycopg://…``, absolute SQLite path; password kept), or None.

    Raises:
        LedgerError: not a database URL.
    """
    if storage is None or not storage.strip():
        return None
    from ratchet.ledger.sql import database_url

    return database_url(storage.strip()).render_as_string(hide_password=False)


def open_store(storage: str | None, run_dir: str | Path, run_id: str, *, create: bool = True,
               readonly: bool = False) -> SQLiteLedger | SQLAlchemyLedger:
    """Open a run's ledger: ``run_dir/ledger.sqlite`` when ``storage`` is None, else the run's rows in
    the ``storage`` database.

    Args:
        storage: Database URL or None (see :func:`storage_url`).
        run_dir: The run directory (used only by the default store).
        run_id: The run id (used only by database stores).
        create: Allow creating the file / table.
        readonly: Refuse appends.

    Raises:
        LedgerError: bad URL, unreachable database, damaged or missing ledger file.
        RunNotFoundError: a database without this run (``create=False`` or ``readonly``).
    """
    url = storage_url(storage)
    if url is None:
        return SQLiteLedger(Path(run_dir) / LEDGER_FILE, create=create, readonly=readonly)
    from ratchet.ledger.sql import SQLAlchemyLedger

    return SQLAlchemyLedger(url, run_id, create=create, readonly=readonly)


def write_pointer(run_dir: str | Path, storage: str, run_id: str) -> Path:
    """Write ``run_dir/ledger.json`` naming the database (password left out) and run id.

    Returns:
        The pointer file's path.
    """
    from ratchet.ledger.sql import display_url

    path = Path(run_dir) / POINTER_FILE
    path.write_text(json.dumps({"storage": display_url(storage), "run_id": run_id}, indent=2) + "\n",
                    encoding="utf-8")
    return path


def read_pointer(run_dir: str | Path) -> Pointer | None:
    """The pointer in ``run_dir``, or None when it has none.

    Raises:
        LedgerError: the pointer file is damaged.
    """
    path = Path(run_dir) / POINTER_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Pointer(str(data["storage"]), str(data["run_id"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"{path} is not a ledger pointer ({type(exc).__name__}: {exc}); it should hold "
                          '{"storage": URL, "run_id": ID}') from None


def with_password_of(pointer_url: str, storage: str | None) -> str:
    """``pointer_url``, or ``storage`` when that names the same database (so a password given with
    ``--storage`` is used for a run found through its pointer)."""
    if storage is None or storage_url(storage) is None:
        return pointer_url
    from ratchet.ledger.sql import display_url

    if display_url(storage) == display_url(pointer_url):
        return storage
    return pointer_url

