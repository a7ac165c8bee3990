"""Content-addressed artifacts: immutable bytes (network weights, SB3 models, data sets) kept beside a
run's events and named by their SHA-256 digest.

Events never hold large bytes: a candidate refers to its artifacts by digest
(:attr:`ratchet.policy.Candidate.artifacts`), and each ledger store keeps the bytes in its own table
(``artifacts`` in a run's SQLite file, ``ratchet_artifacts`` in a shared database, where runs share
identical bytes). An artifact is written before the event that names it, so a resumed or replayed run
always finds what its events refer to; reading one back checks its digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from ratchet.errors import LedgerError

__all__ = ["MAX_ARTIFACT_BYTES", "candidate_artifacts", "check_artifact", "digest"]

#: Largest artifact a store accepts, in bytes (a policy network or a data set of corrections).
MAX_ARTIFACT_BYTES = 512 << 20


def digest(data: bytes) -> str:
    """SHA-256 hex digest (64 characters) of ``data``: its name in the artifact store."""
    return hashlib.sha256(data).hexdigest()


def check_artifact(name: str, data: bytes | None, where: str) -> bytes:
    """``data`` as read back for digest ``name`` from ``where``, checked.

    Raises:
        LedgerError: the store has no such artifact, or its bytes do not match their digest.
    """
    if data is None:
        raise LedgerError(f"artifact {name[:12]} is missing from {where}; the ledger refers to bytes it does not hold")
    if digest(data) != name:
        raise LedgerError(f"artifact {name[:12]} in {where} is damaged (its bytes do not match their digest)")
    return data


def check_size(data: bytes) -> None:
    """Raises LedgerError when ``data`` is too large for the artifact store."""
    if not isinstance(data, (bytes, bytearray)):
        raise LedgerError(f"an artifact must be bytes, got {type(data).__name__}")
    if len(data) > MAX_ARTIFACT_BYTES:
        raise LedgerError(f"an artifact of {len(data):,} bytes exceeds the store's limit of {MAX_ARTIFACT_BYTES:,}")


def candidate_artifacts(ledger: Any, candidates: Iterable[Any]) -> dict[str, bytes]:
    """The bytes of every artifact the ``candidates`` refer to, by digest, read from ``ledger``'s store: what
    a :class:`ratchet.execution.Job` needs to re-run them (``Job(candidate, seed, artifacts)``), and what
    ``export`` and the report read. Plain programs have none (an empty dict, nothing read).

    Args:
        ledger: A ledger store (:class:`ratchet.ledger.LedgerStore`; a read-only one is enough).
        candidates: :class:`ratchet.policy.Candidate` objects.

    Raises:
        LedgerError: an artifact is missing or damaged.
    """
    out: dict[str, bytes] = {}
    for cand in candidates:
        for name in cand.artifacts.values():
            if name not in out:
                out[name] = ledger.get_artifact(name)
    return out
