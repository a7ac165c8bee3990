"""ratchet: make an existing decision policy better, provably.

The loop: plan → execute → critique → refine → gate. Every step is an event in an append-only
ledger; the incumbent only moves up.
"""

from ratchet.critic import Critic, Critique, Evaluation
from ratchet.errors import (LedgerError, PolicyError, RatchetError, RunNotFoundError, SandboxError, SpecError,
                            TaskError, WriterLeaseError)
from ratchet.execution import Executor, Job, Sandbox, executor_from_spec, make_executor
from ratchet.gate import Decision, PairedTestGate, SequentialGate
from ratchet.ledger import Event, EventType, SQLiteLedger
from ratchet.loop import RunResult, resume_run, start_run
from ratchet.policy import Candidate, Parameter, PolicyProgram, export_source, load_policy, parse_policy
from ratchet.progress import ProgressPrinter
from ratchet.refiners import CMAESRefiner, Refiner
from ratchet.report import write_run_report
from ratchet.rollout import Episode
from ratchet.spec import RunSpec, load_spec
from ratchet.task import GymTask, Task

__version__ = "0.1.0"

__all__ = [
    "Candidate", "CMAESRefiner", "Critic", "Critique", "Decision", "Episode", "Evaluation", "Event",
    "EventType", "Executor", "GymTask", "Job", "LedgerError", "PairedTestGate", "Parameter", "SequentialGate", "PolicyError",
    "PolicyProgram", "ProgressPrinter", "RatchetError", "Refiner", "RunNotFoundError", "RunResult", "RunSpec", "SQLiteLedger",
    "Sandbox", "SandboxError", "SpecError", "Task", "TaskError", "executor_from_spec", "export_source", "load_policy",
    "load_spec", "make_executor",
    "parse_policy", "resume_run", "start_run", "write_run_report", "WriterLeaseError",
]


def __getattr__(name: str):  # lazy, so `import ratchet` does not start importing Ray or subprocess plumbing
    if name == "ProcessExecutor":
        from ratchet.execution.process import ProcessExecutor

        return ProcessExecutor
    if name == "RayExecutor":
        from ratchet.execution.ray_executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module 'ratchet' has no attribute {name!r}")
