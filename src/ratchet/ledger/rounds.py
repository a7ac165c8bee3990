"""A person's correction rounds (:mod:`ratchet.correction_round`) as a fold over a run's events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratchet.ledger.events import EventType

__all__ = ["correction_rounds", "unfinished_round"]


def correction_rounds(events: Sequence[Any]) -> dict[int, dict[str, Any]]:
    """Round number -> ``{"recorded": payload, "finished": payload or None}`` (``correction_recorded`` and
    ``correction_finished`` events, in ledger order)."""
    out: dict[int, dict[str, Any]] = {}
    for ev in events:
        if ev.type is EventType.CORRECTION_RECORDED:
            out[int(ev.payload["round"])] = {"recorded": ev.payload, "finished": None}
        elif ev.type is EventType.CORRECTION_FINISHED and int(ev.payload["round"]) in out:
            out[int(ev.payload["round"])]["finished"] = ev.payload
    return out


def unfinished_round(events: Sequence[Any]) -> int | None:
    """The newest correction round recorded but not retrained and gated yet (None when there is none)."""
    rounds = correction_rounds(events)
    last = max(rounds, default=None)
    return last if last is not None and rounds[last]["finished"] is None else None
