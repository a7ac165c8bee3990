"""Compatibility: the Task contract lives in :mod:`ratchet.tasks`, Gymnasium tasks in :mod:`ratchet.tasks.gym`."""

from __future__ import annotations

from ratchet.tasks import Task, success_rule_of
from ratchet.tasks.gym import GymTask, doc_sections, gym_spec

__all__ = ["GymTask", "Task", "doc_sections", "gym_spec", "success_rule_of"]
