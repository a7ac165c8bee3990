"""Typed ledger events. Each event has a unique ``key`` so appends are idempotent."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Event", "EventType"]


class EventType(str, Enum):
    """Every kind of event a run appends, in the order a run normally produces them."""

    RUN_STARTED = "run_started"            # spec, versions, task, policy, seeds of each split
    RUN_RESUMED = "run_resumed"            # a killed run continued
    GENERATION_PLANNED = "generation_planned"  # which refiner gets the generation, and why
    TRAINING_FINISHED = "training_finished"  # a refiner's training job: parent, settings, seeds, env steps, artifacts
    LLM_CALL = "llm_call"                  # a refiner's request to an LLM endpoint and its reply (artifacts), tokens
    EPISODE_TRACED = "episode_traced"      # a recorded training episode replayed for its last steps (a prompt's trace)
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
