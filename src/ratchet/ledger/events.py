"""Typed ledger events. Each event has a unique ``key`` so appends are idempotent."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ratchet.errors import LedgerError

__all__ = ["MAX_PAYLOAD_DEPTH", "Event", "EventType", "RejectionKind", "event_from_row"]

#: How deep an event's payload may nest (objects and arrays in one another). Ratchet writes a few levels (a spec,
#: an array of arrays); a store holding a deeper one is damaged, and reading it as JSON would exhaust the stack.
MAX_PAYLOAD_DEPTH = 100

_STRUCTURE = {c: None for c in range(128) if chr(c) not in '"[]{}'}  # str.translate: keep quotes and brackets
_STRING = re.compile(r'"[^"]*"')
_INNERMOST = re.compile(r"\[\]|\{\}")


class EventType(str, Enum):
    """Every kind of event a run appends, in the order a run normally produces them."""

    RUN_STARTED = "run_started"            # spec, versions, task, policy, seeds of each split
    RUN_RESUMED = "run_resumed"            # a killed run continued
    GENERATION_PLANNED = "generation_planned"  # which refiner gets the generation, and why
    TRAINING_FINISHED = "training_finished"  # a refiner's training job: parent, settings, seeds, env steps, artifacts
    LLM_CALL = "llm_call"                  # a refiner's request to an LLM endpoint and its reply (artifacts), tokens
    EPISODE_TRACED = "episode_traced"      # a recorded training episode replayed for its last steps (a prompt's trace)
    TRANSITIONS_RECORDED = "transitions_recorded"  # a training episode's transitions, recorded on the trusted side (artifact)
    PROPOSAL_REJECTED = "proposal_rejected"  # a proposal whose new source failed its checks (or had none): never ran
    CANDIDATE_PROPOSED = "candidate_proposed"  # a refiner proposed a candidate (full source + params)
    EPISODES_EVALUATED = "episodes_evaluated"  # one candidate's episodes on one split
    GENERATION_FINISHED = "generation_finished"  # planner/refiner summary of one step
    GATE_DECIDED = "gate_decided"          # paired test of a candidate vs the incumbent on validation
    INCUMBENT_CHANGED = "incumbent_changed"
    FINAL_DECISION = "final_decision"      # the budget ended the search (powered, or [planner] final): gated or why not
    TASK_UPDATED = "task_updated"          # a promotion changed the task: a game's league grew (pool, payoffs, meta-strategy)
    RUN_FINISHED = "run_finished"          # stop reason, final test evaluation done
    RUN_FAILED = "run_failed"              # an unexpected error ended the run
    # after run_finished: a person's correction round (ratchet.correction_round); the events between these two
    # (training_finished, candidate_proposed, episodes_evaluated, gate_decided, incumbent_changed) carry its
    # number as "correction_round"
    CORRECTION_EPISODE = "correction_episode"  # one episode of a round being played, as it ends (kill -9 keeps it)
    CORRECTION_RECORDED = "correction_recorded"  # who, the candidate played, seeds, takeover segments, data set
    CORRECTION_FINISHED = "correction_finished"  # the round's retrained student, gate verdict, fresh test evaluation


class RejectionKind(str, Enum):
    """Why a proposal never ran: a ``proposal_rejected`` event's ``kind``, what ``ratchet show``, the report and the
    dashboard count (:meth:`ratchet.ledger.projection.RunState.rejection_counts`)."""

    UNUSABLE = "unusable"  # no usable new source: it failed the checks, an answer held no edit, a request failed
    DUPLICATE = "duplicate"  # the same candidate as one the run already scored (or kept in this generation)
    CASCADE = "cascade"  # dropped by the cascade after its first stage of training episodes
    SCREENED_OUT = "screened_out"  # the world model ranked it below the candidates run
    NOT_SCREENED = "not_screened"  # not run: the world model could not screen yet

    @property
    def label(self) -> str:
        """The kind in words, as ``ratchet show`` counts it (``"6 duplicates, 3 screened out by the world model"``)."""
        return _REJECTION_LABELS[self]

    @classmethod
    def of(cls, payload: dict[str, Any]) -> RejectionKind:
        """A ``proposal_rejected`` payload's kind: its ``kind`` field, or for events written before that field
        existed (ledgers of 2026-12-05 and older), the kind its ``detail`` and ``reason`` text imply."""
        try:
            return cls(payload.get("kind"))
        except ValueError:
            pass
        detail, reason = payload.get("detail") or {}, str(payload.get("reason", ""))
        if not isinstance(detail, dict):
            detail = {}
        return (cls.DUPLICATE if "duplicate_of" in detail or reason.startswith("duplicate:")
                else cls.CASCADE if "stage" in detail
                else cls.SCREENED_OUT if reason.startswith("screened out by the world model")
                else cls.NOT_SCREENED if reason.startswith("not run: the world model")
                else cls.UNUSABLE)


_REJECTION_LABELS = {RejectionKind.UNUSABLE: "no usable new source", RejectionKind.DUPLICATE: "duplicate",
                     RejectionKind.CASCADE: "dropped by the cascade after its first stage",
                     RejectionKind.SCREENED_OUT: "screened out by the world model",
                     RejectionKind.NOT_SCREENED: "not run before the world model could screen"}


@dataclass(frozen=True)
class Event:
    """One ledger row.

    Attributes:
        seq: Position in the ledger (1-based, strictly increasing).
        type: The :class:`EventType`.
        key: Unique identity; appending an existing key is a no-op (idempotent replay).
        time: Unix time (seconds) when appended.
        payload: JSON-ready event data.
    """

    seq: int
    type: EventType
    key: str
    time: float
    payload: dict[str, Any] = field(hash=False)

    def payload_json(self) -> str:
        """The payload as compact JSON."""
        return json.dumps(self.payload, separators=(",", ":"), allow_nan=True)


def _nests_deeper_than(text: str, depth: int) -> bool:
    """Whether JSON ``text`` nests objects and arrays more than ``depth`` deep (exact for valid JSON), without
    recursion: its brackets outside strings, innermost pairs removed one level at a time (C-speed passes).

    Escapes go first (escaped backslashes, then escaped quotes), so every quote left opens or closes a string."""
    if text.count("[") + text.count("{") <= depth:
        return False
    brackets = _STRING.sub("", text.replace("\\\\", "").replace('\\"', "").translate(_STRUCTURE))
    for _ in range(depth):
        brackets, removed = _INNERMOST.subn("", brackets)
        if not removed:
            return False
    return _INNERMOST.search(brackets) is not None


def event_from_row(row: Sequence[Any], location: str) -> Event:
    """An event from a store's row ``(seq, type, key, time, payload JSON text)``: the one read path of every store.

    Args:
        row: The stored columns.
        location: The ledger, for messages (``LedgerStore.location``).

    Raises:
        LedgerError: the row is damaged (one line naming the event): an unknown type, a payload that is not JSON or
            nests deeper than :data:`MAX_PAYLOAD_DEPTH`.
    """
    seq, type_, key, time, payload = row
    try:
        if not isinstance(payload, str):
            raise TypeError(f"its payload is {type(payload).__name__}, not JSON text")
        if _nests_deeper_than(payload, MAX_PAYLOAD_DEPTH):
            raise ValueError(f"its payload nests deeper than {MAX_PAYLOAD_DEPTH} levels")
        return Event(int(seq), EventType(type_), key, float(time), json.loads(payload))
    except (ValueError, TypeError, RecursionError) as exc:
        raise LedgerError(f"ledger {location} is damaged at event {seq}: {exc}") from None
