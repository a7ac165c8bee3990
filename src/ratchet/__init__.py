"""ratchet: make an existing decision policy better, provably.

The loop: plan → execute → critique → refine → gate. Every step is an event in an append-only
ledger; the incumbent only moves up.
"""

from typing import TYPE_CHECKING

from ratchet.errors import (
    LedgerError,
    PolicyError,
    RatchetError,
    RunNotFoundError,
    SandboxError,
    SpecError,
    TaskError,
    WriterLeaseError,
)

#: Public name -> the module that defines it, imported on first use (PEP 562): a worker or training process
#: that imports ``ratchet.execution.worker`` must not pay for the gate's SciPy, the loop or the report.
_LAZY = {
    **dict.fromkeys(("Critic", "Critique", "Evaluation"), "ratchet.critic"),
    **dict.fromkeys(("Executor", "Job", "Sandbox", "executor_from_spec", "make_executor"), "ratchet.execution"),
    **dict.fromkeys(("Decision", "PairedTestGate", "SequentialGate"), "ratchet.gate"),
    **dict.fromkeys(("Event", "EventType", "SQLiteLedger"), "ratchet.ledger"),
    **dict.fromkeys(("RunResult", "resume_run", "start_run"), "ratchet.loop"),
    **dict.fromkeys(("Candidate", "Parameter", "PolicyProgram", "export_source", "load_policy", "parse_policy"),
                    "ratchet.policy"),
    "ProgressPrinter": "ratchet.progress",
    **dict.fromkeys(("CMAESRefiner", "Refiner"), "ratchet.refiners"),
    "write_run_report": "ratchet.report",
    "Episode": "ratchet.rollout",
    **dict.fromkeys(("RunSpec", "load_spec"), "ratchet.spec"),
    **dict.fromkeys(("GymTask", "Task"), "ratchet.task"),
    "ProcessExecutor": "ratchet.execution.process",
    "RayExecutor": "ratchet.execution.ray_executor",
}

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, eagerly
    from ratchet.critic import Critic, Critique, Evaluation
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
    "CMAESRefiner",
    "Candidate",
    "Critic",
    "Critique",
    "Decision",
    "Episode",
    "Evaluation",
    "Event",
    "EventType",
    "Executor",
    "GymTask",
    "Job",
    "LedgerError",
    "PairedTestGate",
    "Parameter",
    "PolicyError",
    "PolicyProgram",
    "ProgressPrinter",
    "RatchetError",
    "Refiner",
    "RunNotFoundError",
    "RunResult",
    "RunSpec",
    "SQLiteLedger",
    "Sandbox",
    "SandboxError",
    "SequentialGate",
    "SpecError",
    "Task",
    "TaskError",
    "WriterLeaseError",
    "executor_from_spec",
    "export_source",
    "load_policy",
    "load_spec",
    "make_executor",
    "parse_policy",
    "resume_run",
    "start_run",
    "write_run_report",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ratchet' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
