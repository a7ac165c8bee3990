"""Blocksworld generalized planning (examples/blocksworld): held-out validity, cost and planning time, as a table.

Every policy row plans the held-out test problems (seeds 3k+2, k < N; 8-10 blocks, larger than any training
problem) and each plan is scored by the example's evaluator: unified-planning's validator decides validity,
the cost ratio is plan length / the optimal plan's (Fast Downward A* + LM-cut, through up-fast-downward),
the policy's time is its plan() call (in-process here; under ratchet it runs in the sandbox, ~50 µs more per
call) and the reference time is the optimal planner's solve (subprocess, translation included). With --lama
Fast Downward's satisficing lama-first plans the same problems too, for scale.

The issue's goal: >= 99 % valid plans, mean cost <= 1.05 x the reference, policy time below the reference's.

Usage: python benchmarks/planning.py [--n 100] [--lama] [--policy FILE ...]
"""

from __future__ import annotations

import argparse
import time
import types
from pathlib import Path

import numpy as np
from _common import machine

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "blocksworld"


def _load(path: Path) -> types.ModuleType:
    """Executed into a fresh module, as ratchet loads an evaluator (not imported)."""
    module = types.ModuleType(f"blocksworld_{path.stem}")
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the project's own files
    return module


ev = _load(EXAMPLE / "evaluate.py")
POLICY = _load(EXAMPLE / "policy.py")
DEFAULTS = {k: v["default"] for k, v in POLICY.PARAMETERS.items()}

# Rows: label -> (policy module, parameter values).
ROWS: dict[str, tuple[types.ModuleType, dict]] = {
    "start policy (defaults: misplaced blocks to the table, then build)": (POLICY, DEFAULTS),
    # placeholder: set by hand (final-place moves first, put aside blocks that unlock others and do not wait)
    "hand-set weights (placeholder)": (POLICY, dict(DEFAULTS, w_final=5.0, w_unlock=1.0, w_waits=-2.0)),
    # ---- ratchet's results: add one row per run (the incumbent's parameter values, from `ratchet show RUN`) ----
    # "ratchet, run seed 0 (cmaes, 6 000 instances)": (POLICY, dict(DEFAULTS, w_final=..., ...)),
    # ---- end of ratchet's rows ----
}


class _Local:
    def __init__(self, module: types.ModuleType, params: dict):
        self.module, self.params = module, params

    def plan(self, state, goal):
        return self.module.plan(state, goal, self.params)


def _row(label: str, results: list[dict]) -> str:
    ok = [r for r in results if r["success"]]
    ratios = np.array([r["diagnostics"]["cost_ratio"] for r in ok]) if ok else np.array([np.nan])
    policy_ms = 1e3 * np.mean([r["diagnostics"]["policy_time_s"] for r in results])
    ref_s = np.mean([r["diagnostics"]["reference_time_s"] for r in ok]) if ok else float("nan")
    return (f"| {label} | {100 * len(ok) / len(results):.1f} | {ratios.mean():.3f} | {ratios.max():.3f} | "
            f"{100 * np.mean(ratios <= 1.0):.0f} | {policy_ms:.2f} | {ref_s:.2f} |")


def _lama_row(instances: list[dict]) -> str:
    up = ev._up()
    ratios, seconds = [], []
    for inst in instances:
        start = time.perf_counter()
        with up["OneshotPlanner"](name="fast-downward") as planner:   # up-fast-downward's default: lama-first
            result = planner.solve(ev.up_problem(inst))
        seconds.append(time.perf_counter() - start)
        ratios.append(len(result.plan.actions) / ev.reference(inst)[0])
    r = np.array(ratios)
    return (f"| Fast Downward lama-first (for scale) | 100.0 | {r.mean():.3f} | {r.max():.3f} | "
            f"{100 * np.mean(r <= 1.0):.0f} | {1e3 * np.mean(seconds):.0f} | "
            f"{np.mean([ev.reference(i)[1] for i in instances]):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="Held-out test problems (seeds 3k+2, k < N).")
    ap.add_argument("--lama", action="store_true", help="Also plan them with Fast Downward lama-first.")
    ap.add_argument("--policy", action="append", default=[], type=Path,
                    help="Another policy file (at its PARAMETERS defaults, e.g. one `ratchet export` wrote).")
    args = ap.parse_args()
    rows = dict(ROWS)
    for path in args.policy:
        module = _load(path)
        rows[f"{path}"] = (module, {k: v["default"] for k, v in module.PARAMETERS.items()})
    instances = [ev.make_instance(3 * k + 2) for k in range(args.n)]
    start = time.perf_counter()
    for inst in instances:
        ev.reference(inst)
    solve_s = time.perf_counter() - start
    sizes = [i["n"] for i in instances]
    print(f"{args.n} held-out test problems (seeds 3k+2), {min(sizes)}-{max(sizes)} blocks; optimal reference "
          f"plans in {solve_s:.0f} s (max {max(ev.reference(i)[1] for i in instances):.1f} s per problem)\n")
    print("| policy | valid % | mean cost / optimal | max cost / optimal | optimal plans % | policy time (ms) "
          "| optimal planner time (s) |")
    print("|---|---|---|---|---|---|---|")
    for label, (module, params) in rows.items():
        print(_row(label, [ev.evaluate(inst, _Local(module, params)) for inst in instances]), flush=True)
    if args.lama:
        print(_lama_row(instances))
    print(f"\nMachine: {machine()}")


if __name__ == "__main__":
    main()
