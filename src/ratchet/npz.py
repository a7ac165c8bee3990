"""Reading ``.npz`` artifacts in the driver without trusting their size.

An artifact's bytes may come from a sandboxed trainer (a data set, a network's weights), and a
``.npz`` is a zip archive: 243 KB of deflated zeros unpack to 250 M numbers, and ``np.load`` followed
by ``astype(float64)`` turns them into 4 GB. Everything the driver reads of an ``.npz`` goes through
this module:

- :func:`npz_headers` lists the arrays from their ``.npy`` headers (name, shape, dtype) without
  decompressing any data;
- :func:`load_npz` loads the arrays only when what they unpack to fits :func:`unpack_limit` (a
  multiple of the artifact's own size, with a floor and an absolute cap), and never unpickles.

The zip reader stops a member at the uncompressed size its header declares, so checking the declared
sizes bounds what decompression can produce.
"""

from __future__ import annotations

import io
import math
import zipfile
from dataclasses import dataclass

import numpy as np

__all__ = [
    "UNPACK_CAP",
    "UNPACK_FLOOR",
    "UNPACK_RATIO",
    "ArrayHeader",
    "NpzError",
    "check_zip",
    "load_npz",
    "npz_headers",
    "unpack_limit",
]

#: What an artifact may unpack to, as a multiple of its own size in bytes ...
UNPACK_RATIO = 32
#: ... but at least this many bytes (small artifacts that compress well) ...
UNPACK_FLOOR = 64 * 2**20
#: ... and never more than this many bytes.
UNPACK_CAP = 2 * 2**30
_MAX_MEMBERS = 4096
_MAX_HEADER_BYTES = 10_000


class NpzError(ValueError):
    """An artifact is not a readable ``.npz``, holds pickled objects, or unpacks to more than the driver may
    load; ``str(exc)`` is one line saying which."""


@dataclass(frozen=True)
class ArrayHeader:
    """One array of an ``.npz``, as its ``.npy`` header describes it.

    Attributes:
        name: The array's key (the member name without ``.npy``).
        shape: Its shape.
        dtype: Its dtype (never an object dtype: those are refused).
        nbytes: Bytes its data takes once loaded (``prod(shape) * itemsize``).
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


def unpack_limit(artifact_bytes: int) -> int:
    """The most bytes an artifact of ``artifact_bytes`` bytes may unpack to in the driver:
    ``min(UNPACK_CAP, max(UNPACK_FLOOR, UNPACK_RATIO * artifact_bytes))``."""
    return min(UNPACK_CAP, max(UNPACK_FLOOR, UNPACK_RATIO * int(artifact_bytes)))


def _members(zf: zipfile.ZipFile, data_len: int, limit: int | None) -> list[zipfile.ZipInfo]:
    infos = zf.infolist()
    if len(infos) > _MAX_MEMBERS:
        raise NpzError(f"an .npz of {len(infos):,} members (at most {_MAX_MEMBERS:,})")
    limit = unpack_limit(data_len) if limit is None else limit
    declared = sum(i.file_size for i in infos)
    if declared > limit:
        raise NpzError(f"an .npz of {data_len:,} bytes that unpacks to {declared:,} bytes (the driver loads at most "
                       f"{limit:,} for it)")
    return infos


def check_zip(data: bytes, *, limit: int | None = None) -> list[str]:
    """The member names of a zip archive (e.g. a Stable-Baselines3 model), after checking what its members
    declare they unpack to; nothing is decompressed.

    Args:
        data: The archive's bytes.
        limit: Most bytes all members may unpack to (default :func:`unpack_limit` of the archive's size).

    Raises:
        NpzError: not a zip archive, too many members, or more unpacked bytes declared than ``limit``.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return [i.filename for i in _members(zf, len(data), limit)]
    except NpzError:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: every failure is an NpzError
        raise NpzError(f"not a zip archive ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None


def npz_headers(data: bytes, *, limit: int | None = None) -> list[ArrayHeader]:
    """The arrays of an ``.npz`` from their headers, without decompressing their data.

    Args:
        data: The artifact's bytes.
        limit: Most bytes the archive may declare unpacked (default :func:`unpack_limit` of its size).

    Returns:
        One :class:`ArrayHeader` per member, in archive order.

    Raises:
        NpzError: not a zip of ``.npy`` members, an object (pickled) dtype, a header whose data does not fit
            its member, or more unpacked bytes declared than ``limit``.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            out = []
            for info in _members(zf, len(data), limit):
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read(f, max_header_size=_MAX_HEADER_BYTES)
                if dtype.hasobject:
                    raise NpzError(f"an .npz whose array {info.filename!r} holds Python objects (pickles are "
                                   "never loaded)")
                nbytes = math.prod(shape) * dtype.itemsize
                if nbytes > info.file_size:
                    raise NpzError(f"an .npz whose array {info.filename!r} declares {nbytes:,} bytes of data in a "
                                   f"member of {info.file_size:,}")
                name = info.filename.removesuffix(".npy")
                out.append(ArrayHeader(name, tuple(int(s) for s in shape), dtype, nbytes))
            return out
    except NpzError:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: BadZipFile, ValueError from a malformed header, EOFError, ...
        raise NpzError(f"not an .npz ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None


def load_npz(data: bytes, *, limit: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (``allow_pickle=False``), after :func:`npz_headers` has checked that they fit.

    Args:
        data: The artifact's bytes.
        limit: Most bytes the arrays may unpack to (default :func:`unpack_limit` of the artifact's size).

    Returns:
        ``{name: array}`` in archive order.

    Raises:
        NpzError: as :func:`npz_headers`, or the data cannot be read.
    """
    npz_headers(data, limit=limit)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: every failure is an NpzError
        raise NpzError(f"not an .npz ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None
