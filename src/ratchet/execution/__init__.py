"""Executors run (candidate, seed) pairs somewhere and return :class:`~ratchet.rollout.Episode` records.

The interface is small so that backends (process pool today, Ray later) are swappable and share one
conformance test suite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ratchet.policy import Candidate
from ratchet.rollout import Episode
from ratchet.task import Task

__all__ = ["Job", "Executor", "ProcessExecutor", "make_executor"]


@dataclass(frozen=True)
class Job:
    """One episode to run: a candidate on a seed."""

    candidate: Candidate
    seed: int


class Executor(Protocol):
    """Runs jobs; a failing policy gives errored episodes, never an exception."""

    def run(self, task: Task, jobs: Sequence[Job],
            on_episode: Callable[[int, Episode], None] | None = None) -> list[Episode]:
        """Run every job and return its episode, in job order.

        Args:
            task: The task whose environments to use.
            jobs: (candidate, seed) pairs.
            on_episode: Called as ``on_episode(job_index, episode)`` as each episode finishes
                (completion order).
        """

    def close(self) -> None:
        """Stop workers. Safe to call twice."""


def make_executor(workers: int = 0, episode_timeout_s: float = 60.0) -> Executor:
    """The default executor: a pool of ``workers`` processes (0 means one per CPU core)."""
    from ratchet.execution.process import ProcessExecutor

    return ProcessExecutor(workers=workers, episode_timeout_s=episode_timeout_s)


def __getattr__(name: str):  # lazy: keep `import ratchet.execution` light
    if name == "ProcessExecutor":
        from ratchet.execution.process import ProcessExecutor

        return ProcessExecutor
    raise AttributeError(name)
