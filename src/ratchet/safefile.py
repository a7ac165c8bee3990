"""Reading files that policy code could have replaced, without trusting them.

A worker's directory is writable by the policy it runs: any name in it (``worker.log``, a render
``render-3.gif``) may have been swapped for a symlink to a secret (``/root/.pgpass``,
``/proc/self/environ``), a FIFO (an ``open`` or ``read`` that never returns), a device (``/dev/zero``:
endless bytes) or a hard link. Everything the driver reads from or copies out of such a folder goes
through this module: opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink fails, a FIFO does not
block), accepted only if ``fstat`` says it is a regular file with one link, and read in bounded
chunks against a size cap and a deadline.

Files the driver writes (:func:`write_bytes`, :func:`write_files`: a ledger's journal, a report, an export) go
through a temporary file beside them and a rename, so a failed or interrupted write (a full disk, a kill) leaves
no partial file.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["UnsafeFile", "copy_out", "read_bytes", "read_tail", "write_bytes", "write_files"]

_CHUNK = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(OSError):
    """A file that is not a plain regular file we may read (symlink, FIFO, device, hard link, too big,
    too slow). Subclasses :class:`OSError`, so callers that tolerate a missing file tolerate this.
    ``str(exc)`` names the file and the reason."""

    def __str__(self) -> str:
        return f"{os.path.basename(self.filename or '')} {self.strerror}".strip()


def _open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """An fd on ``path`` if it is a regular file with one link, opened without following a symlink."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(exc.errno, "is a symbolic link", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(0, "is not a regular file", str(path))
        if st.st_nlink != 1:
            raise UnsafeFile(0, "is a hard link", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_range(fd: int, start: int, n: int, deadline: float, path: str) -> bytes:
    os.lseek(fd, start, os.SEEK_SET)
    buf = bytearray()
    while len(buf) < n:
        if time.monotonic() > deadline:
            raise UnsafeFile(0, "took too long to read", path)
        try:
            chunk = os.read(fd, min(_CHUNK, n - len(buf)))
        except BlockingIOError:
            raise UnsafeFile(0, "would block", path) from None
        if not chunk:  # the file shrank while we read it
            break
        buf += chunk
    return bytes(buf)


def read_tail(path: str | os.PathLike[str], max_bytes: int, deadline_s: float = 2.0) -> bytes:
    """The last ``max_bytes`` bytes of a regular file (all of it when smaller).

    Args:
        path: The file; a symlink, FIFO, socket or device is refused, never followed or read.
        max_bytes: Most bytes returned (and read).
        deadline_s: Seconds the read may take.

    Raises:
        UnsafeFile: ``path`` is not a plain regular file, or the read ran past its deadline.
        OSError: ``path`` cannot be opened (e.g. missing).
    """
    deadline = time.monotonic() + deadline_s
    fd, st = _open_regular(path)
    try:
        start = max(0, st.st_size - max_bytes)
        return _read_range(fd, start, min(max_bytes, st.st_size), deadline, str(path))
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike[str], max_bytes: int, deadline_s: float = 10.0) -> bytes:
    """The whole content of a regular file of at most ``max_bytes`` bytes.

    Raises:
        UnsafeFile: ``path`` is not a plain regular file, is larger than ``max_bytes``, or the read
            ran past its deadline.
        OSError: ``path`` cannot be opened.
    """
    deadline = time.monotonic() + deadline_s
    fd, st = _open_regular(path)
    try:
        if st.st_size > max_bytes:
            raise UnsafeFile(0, f"is larger than {max_bytes} bytes", str(path))
        data = _read_range(fd, 0, max_bytes + 1, deadline, str(path))
        if len(data) > max_bytes:
            raise UnsafeFile(0, f"is larger than {max_bytes} bytes", str(path))
        return data
    finally:
        os.close(fd)


def copy_out(src: str | os.PathLike[str], dst: str | os.PathLike[str], max_bytes: int,
             deadline_s: float = 60.0) -> None:
    """Copy the regular file ``src`` (in a folder policy code could write) to ``dst``.

    The source is opened as :func:`read_bytes` opens it; the destination is written by this process
    into a fresh temporary file beside ``dst`` and renamed over it, so neither a symlink at the source
    nor one at the destination is ever followed, and a failed copy leaves ``dst`` as it was. The copy
    gets mode 0644 (a render is meant to be shared).

    Raises:
        UnsafeFile: ``src`` is not a plain regular file or is larger than ``max_bytes``; ``dst`` is
            a symbolic link (refused, not replaced).
        OSError: ``src`` cannot be opened, or ``dst``'s folder cannot be written.
    """
    dst = Path(dst)
    if dst.is_symlink():
        raise UnsafeFile(0, "is a symbolic link; not overwriting it", str(dst))
    deadline = time.monotonic() + deadline_s
    fd, st = _open_regular(src)
    try:
        if st.st_size > max_bytes:
            raise UnsafeFile(0, f"is larger than {max_bytes} bytes", str(src))
        dst.parent.mkdir(parents=True, exist_ok=True)
        out_fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
        try:
            copied = 0
            while True:
                data = _read_range(fd, copied, min(_CHUNK, max_bytes + 1 - copied), deadline, str(src))
                if not data:
                    break
                copied += len(data)
                if copied > max_bytes:
                    raise UnsafeFile(0, f"is larger than {max_bytes} bytes", str(src))
                view = memoryview(data)
                while view:
                    view = view[os.write(out_fd, view):]
            os.fchmod(out_fd, 0o644)
            os.close(out_fd)
            out_fd = -1
            if dst.is_symlink():  # planted while we copied
                raise UnsafeFile(0, "is a symbolic link; not overwriting it", str(dst))
            os.replace(tmp, dst)
        except BaseException:
            if out_fd >= 0:
                os.close(out_fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def write_bytes(dst: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``dst`` atomically and durably: a temporary file in ``dst``'s folder (created if missing),
    flushed to disk (``fsync``), then renamed over ``dst``, so a kill at any moment, or a failed write (a full
    disk), leaves ``dst`` as it was or whole, and no temporary file behind. A symbolic link at ``dst`` is refused,
    not followed or replaced.

    Args:
        mode: The file's permission bits (e.g. ``0o644`` for a file meant to be shared); default the temporary
            file's ``0o600``.

    Raises:
        UnsafeFile: ``dst`` is a symbolic link.
        OSError: the folder cannot be written (e.g. ``ENOSPC``: the disk is full).
    """
    write_files({Path(dst): data}, mode)


def write_files(files: Mapping[Path, bytes], mode: int | None = None) -> None:
    """Write several files all or none, each as :func:`write_bytes` writes one: every file's content goes into a
    temporary file beside it (flushed to disk) before any is renamed over its destination, so a failed write (a
    full disk) changes none of them and leaves no temporary file behind.

    Args:
        files: Each destination and its bytes.
        mode: The files' permission bits; default ``0o600``.

    Raises:
        UnsafeFile: a destination is a symbolic link (refused, not followed or replaced).
        OSError: a folder cannot be written (e.g. ``ENOSPC``: the disk is full).
    """
    staged: list[tuple[str, Path]] = []
    try:
        for dst, data in files.items():
            if dst.is_symlink():
                raise UnsafeFile(0, "is a symbolic link; not overwriting it", str(dst))
            dst.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
            staged.append((tmp, dst))
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if mode is not None:
                    os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
        for tmp, dst in staged:
            os.replace(tmp, dst)
    except BaseException:
        for tmp, _ in staged:  # those already renamed are gone from here
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise
