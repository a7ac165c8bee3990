"""Files in a worker's folder are read and copied without following links (ratchet.safefile)."""

from __future__ import annotations

import os
import time

import pytest

from ratchet.safefile import UnsafeFile, copy_out, read_bytes, read_tail, write_files


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret"
    path.write_text("hunter2")
    return path


def test_read_tail_reads_the_end_of_a_regular_file(tmp_path):
    log = tmp_path / "worker.log"
    log.write_bytes(b"a" * 10_000 + b"\nlast line\n")
    assert read_tail(log, 11) == b"\nlast line\n"
    assert read_tail(log, 10**6) == log.read_bytes()
    assert read_bytes(log, 10**6) == log.read_bytes()
    with pytest.raises(UnsafeFile, match="larger than"):
        read_bytes(log, 100)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["symlink", "fifo", "dev-zero", "dir", "hardlink"])
def test_anything_but_a_plain_file_is_refused(tmp_path, secret, kind):
    planted = tmp_path / "worker.log"
    if kind == "symlink":
        planted.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(planted)
    elif kind == "dev-zero":
        planted.symlink_to("/dev/zero")
    elif kind == "dir":
        planted.mkdir()
    else:
        os.link(secret, planted)
    for read in (lambda: read_tail(planted, 4096), lambda: read_bytes(planted, 4096),
                 lambda: copy_out(planted, tmp_path / "out", 4096)):
        with pytest.raises(UnsafeFile):
            read()
    assert not (tmp_path / "out").exists()


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_tail(tmp_path / "nothing", 10)


def test_copy_out_writes_the_destination_itself(tmp_path, secret):
    src = tmp_path / "render.gif"
    src.write_bytes(b"GIF89a" + bytes(1000))
    dst = tmp_path / "sub" / "out.gif"
    copy_out(src, dst, 10**6)
    assert dst.read_bytes() == src.read_bytes() and not dst.is_symlink() and src.exists()
    copy_out(src, dst, 10**6)  # overwrites a regular file
    with pytest.raises(UnsafeFile, match="larger than"):
        copy_out(src, tmp_path / "big.gif", 100)
    assert not (tmp_path / "big.gif").exists()
    link = tmp_path / "link.gif"
    link.symlink_to(secret)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        copy_out(src, link, 10**6)
    assert secret.read_text() == "hunter2"
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["out.gif"]  # no temporary file left


def test_a_fifo_never_blocks(tmp_path):
    fifo = tmp_path / "worker.log"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(UnsafeFile):
        read_tail(fifo, 4096)
    assert time.monotonic() - t0 < 10  # a blocking open would wait for a writer forever


def test_write_files_writes_all_or_none(tmp_path):
    """A write that fails part way (here a file-size limit, as a full disk) changes none of the files and leaves no
    temporary file; the files that are written get the mode asked for."""
    import resource

    old = tmp_path / "a.py"
    old.write_bytes(b"old")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        with pytest.raises(OSError):
            write_files({old: b"new", tmp_path / "b.npz": b"x" * 5000}, mode=0o644)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert sorted(os.listdir(tmp_path)) == ["a.py"] and old.read_bytes() == b"old"
    write_files({old: b"new", tmp_path / "sub" / "b.npz": b"x" * 5000}, mode=0o644)
    assert old.read_bytes() == b"new" and (tmp_path / "sub" / "b.npz").stat().st_size == 5000
    assert (old.stat().st_mode & 0o777) == 0o644
