"""Where a run's ledger lives: the one place that picks a store for a run.

By default each run directory holds its own SQLite file (``ledger.sqlite``). With a storage URL
(``--storage``), the run's events go to a shared database instead and the run directory holds a
pointer file (``ledger.json``: the URL without its password, and the run id), so commands given the
run directory and that URL find the ledger again.

A pointer is a file in a runs folder, and anyone who can write there can write one: it is followed to
a database only when the command names that same database (``--storage`` or ``RATCHET_STORAGE``), so
a planted pointer never makes ratchet connect to a host of its choosing with the user's password
(``PGPASSWORD``, ``~/.pgpass``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ratchet.errors import LedgerError, StorageNotNamedError
from ratchet.ledger.sqlite import SQLiteLedger

if TYPE_CHECKING:
    from ratchet.ledger.sql import SQLAlchemyLedger

# ratchet.ledger.sql (SQLAlchemy) is imported only when a storage URL is used: worker processes and
# default runs never pay for it.

__all__ = [
    "LEDGER_FILE",
    "POINTER_FILE",
    "RUN_ID",
    "Pointer",
    "followed_url",
    "is_run_id",
    "open_store",
    "read_pointer",
    "storage_url",
    "write_pointer",
]

#: The per-run SQLite ledger in a run directory (the default store).
LEDGER_FILE = "ledger.sqlite"
#: The pointer to a run's ledger in a shared database, in a run directory.
POINTER_FILE = "ledger.json"
#: What a run id may look like: a plain name (use ``fullmatch``: ``$`` also matches before a final newline).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def is_run_id(run_id: object) -> bool:
    """Whether ``run_id`` is a run id: a string that names a run directory as one path component (letters, digits,
    ``.``, ``_`` and ``-``, at most 200, no ``..``). The one check for a run id from the command line, a URL or a
    ledger (where a damaged or hostile one must never become ``../../x`` or ``/abs`` in a path)."""
    return isinstance(run_id, str) and RUN_ID.fullmatch(run_id) is not None and ".." not in run_id


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
        if not is_run_id(data["run_id"]):
            raise ValueError(f"run_id {str(data['run_id'])[:60]!r} is not a plain name")
        return Pointer(str(data["storage"]), data["run_id"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise LedgerError(f"{path} is not a ledger pointer ({type(exc).__name__}: {exc}); it should hold "
                          '{"storage": URL, "run_id": ID}') from None


def followed_url(pointer: Pointer, storage: str | None, run: str) -> str:
    """The database URL to open a run found through its pointer: ``storage`` itself (with its password), when it
    names the pointer's database; a pointer is never followed to a database the command does not name.

    Args:
        pointer: The run directory's pointer (untrusted: a file in a runs folder).
        storage: The command's ``--storage`` value (or ``RATCHET_STORAGE``), or None.
        run: The run directory's name, for the message.

    Returns:
        ``storage``, normalised (see :func:`storage_url`).

    Raises:
        StorageNotNamedError: ``storage`` is None or names another database (nothing is connected to).
        LedgerError: the pointer's URL is not a database URL.
    """
    from ratchet.ledger.sql import display_url

    where = display_url(pointer.storage)
    url = storage_url(storage)
    if url is None or display_url(url) != where:
        raise StorageNotNamedError(where, run)
    return url
