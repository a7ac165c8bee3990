"""The layer contract: imports point down the stack of DESIGN.md (cli → loop → planner/gate/refiners →
execution → tasks/policies/rollout → ledger/errors), function-local imports included; nothing below imports
what is above it, so there are no import cycles between the package's parts."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ratchet"

#: The package's parts, top first. A module may import its own part and the parts below it, never above.
LAYERS = [
    "cli",
    "ratchet",  # the package's public API (__init__)
    "dashboard", "report", "correct", "progress", "advice",
    "correction_round",
    "loop",
    "services",
    "planner", "spec", "shortlist",
    "refiners",
    "data", "runs", "metrics",
    "gate", "proposals",
    "execution",
    "task",  # ratchet.task: the names older code imports, from tasks/
    "tasks", "policies", "trace",
    "ledger",
    "critic", "diagnosers", "policy",
    "rollout",
    "processes", "npz", "safefile", "text", "errors",
]
_PACKAGES = {"dashboard", "execution", "ledger", "policies", "refiners", "report", "tasks"}


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
