"""The layer contract: imports point down the stack of DESIGN.md (cli → loop → planner/gate/refiners →
execution → tasks/policies/rollout → ledger/errors), function-local imports included; nothing below imports
what is above it, so there are no import cycles between the package's parts."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ratchet"

#: The package's parts, top first. A module may import its own part and the parts below it, never above.
LAYERS = [
    "__main__",
    "cli",
    "ratchet",  # the package's public API (__init__)
    "dashboard", "report", "correct", "progress", "advice",
    "correction_round",
    "loop",
    "overlap",  # [planner] overlap_gate: the next generation's episodes beside the gate
    "deciders",  # [planner] decide: one decider per mode, behind one contract
    "services",
    "step",  # the record of one generation the loop's phases pass on
    "planner", "spec", "shortlist",
    "refiners",
    "data", "runs", "metrics",
    "gate", "proposals",
    "execution",
    "task",  # ratchet.task: the names older code imports, from tasks/
    "tasks", "policies", "trace",
    "worldmodel",  # transitions, the ensemble, imagined rollouts, the screen's rules
    "ledger",
    "critic", "diagnosers", "policy",
    "rollout",
    "processes", "npz", "safefile", "text", "regions", "errors",
]
_PACKAGES = {"dashboard", "deciders", "execution", "ledger", "policies", "refiners", "report", "tasks", "worldmodel"}


def part_of(module: str) -> str:
    """``ratchet.execution.worker`` → ``execution``; ``ratchet.loop`` → ``loop``; ``ratchet`` → ``ratchet``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ratchet"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``ratchet`` import in a file, at any depth (function-local ones too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ratchet"):
            if node.module == "ratchet":  # from ratchet import x: x is a part
                out += [(node.lineno, f"ratchet.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("ratchet")]
    return out


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_part_has_a_layer():
    parts = {part_of(module_of(p)) for p in SRC.rglob("*.py")}
    assert parts <= set(LAYERS), f"add {sorted(parts - set(LAYERS))} to LAYERS in tests/test_layers.py"


def test_imports_point_down():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        me = part_of(module_of(path))
        for line, target in imports_of(path):
            them = part_of(target)
            if them in rank and rank[them] < rank[me]:
                upward.append(f"{path.relative_to(SRC.parent)}:{line} ({me}) imports {target} ({them})")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_the_loop_reads_like_a_few_calls_and_probes_nothing_by_name():
    """Issue 42: the run loop's driving method (``_Run.run``) is at most 40 lines, and the loop, its services, its
    deciders and the critic ask no executor, task, gate or refiner for an attribute by name (getattr/hasattr):
    capabilities are declared in the contracts and read once."""
    loop = ast.parse((SRC / "loop.py").read_text(encoding="utf-8"))
    run = next(n for c in ast.walk(loop) if isinstance(c, ast.ClassDef) and c.name == "_Run"
               for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    assert run.end_lineno is not None and run.end_lineno - run.lineno + 1 <= 40
    probes = []
    for path in [SRC / "loop.py", SRC / "services.py", SRC / "step.py", SRC / "critic.py",
                 *sorted((SRC / "deciders").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                probes.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    assert not probes, f"probes by name: {probes}"
